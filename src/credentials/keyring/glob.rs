//! Go's `filepath.Match` for one host label: `*` any run of characters, `?` any one, `[...]` a
//! class (`[^...]` negated, `a-z` ranges), `\` escapes. A malformed pattern matches nothing.

/// Whether `pattern` has nothing special: it matches only itself.
pub fn is_literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', '\\'])
}

/// Whether `label` matches the glob `pattern`.
pub fn matches(pattern: &str, label: &str) -> bool {
    if is_literal(pattern) {
        return pattern == label;
    }
    let pattern: Vec<char> = pattern.chars().collect();
    let label: Vec<char> = label.chars().collect();
    well_formed(&pattern) && match_from(&pattern, &label)
}

/// The classic wildcard walk: on a mismatch, go back to the last `*` and let it take one more
/// character. Quadratic at worst, so a hostile key cannot make a lookup slow.
fn match_from(pattern: &[char], label: &[char]) -> bool {
    let (mut at_pattern, mut at_label) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while at_label < label.len() {
        if pattern.get(at_pattern) == Some(&'*') {
            at_pattern += 1;
            last_star = Some((at_pattern, at_label));
            continue;
        }
        if at_pattern < pattern.len()
            && let Some((true, used)) = one(&pattern[at_pattern..], label[at_label])
        {
            at_pattern += used;
            at_label += 1;
            continue;
        }
        let Some((after_star, taken)) = last_star else { return false };
        last_star = Some((after_star, taken + 1));
        (at_pattern, at_label) = (after_star, taken + 1);
    }
    pattern[at_pattern..].iter().all(|&c| c == '*')
}

/// Matches the single-character item at the start of `pattern` against `c`: whether it matched
/// and how many pattern characters the item used; `None` when the item is malformed.
fn one(pattern: &[char], c: char) -> Option<(bool, usize)> {
    match pattern[0] {
        '?' => Some((true, 1)),
        '\\' => pattern.get(1).map(|&escaped| (escaped == c, 2)),
        '[' => class(pattern, c),
        literal => Some((literal == c, 1)),
    }
}

/// A `[...]` class at the start of `pattern`.
fn class(pattern: &[char], c: char) -> Option<(bool, usize)> {
    let mut index = 1;
    let negated = pattern.get(index) == Some(&'^');
    if negated {
        index += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let &current = pattern.get(index)?;
        if current == ']' && !first {
            index += 1;
            break;
        }
        first = false;
        let (low, used) = class_char(&pattern[index..])?;
        index += used;
        let high = if pattern.get(index) == Some(&'-') {
            let (high, used) = class_char(&pattern[index + 1..])?;
            index += 1 + used;
            high
        } else {
            low
        };
        if low <= c && c <= high {
            matched = true;
        }
    }
    Some((matched != negated, index))
}

/// One character of a class, escaped or not; `-` and `]` cannot stand alone there.
fn class_char(pattern: &[char]) -> Option<(char, usize)> {
    match pattern.first()? {
        '\\' => pattern.get(1).map(|&c| (c, 2)),
        '-' | ']' => None,
        &c => Some((c, 1)),
    }
}

/// Go checks the whole pattern, so a malformed one never matches, however its start compares.
fn well_formed(pattern: &[char]) -> bool {
    let mut index = 0;
    while index < pattern.len() {
        if pattern[index] == '*' {
            index += 1;
            continue;
        }
        match one(&pattern[index..], '\0') {
            Some((_, used)) => index += used,
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs_match_as_go_filepath_match_does() {
        let cases = [
            ("*", "registry", true),
            ("*", "", true),
            ("reg*", "registry", true),
            ("*try", "registry", true),
            ("r?gistry", "registry", true),
            ("r?gistry", "rgistry", false),
            ("[a-c]b", "bb", true),
            ("[a-c]b", "db", false),
            ("[^a-c]b", "db", true),
            ("[^a-c]b", "ab", false),
            ("[\\]]", "]", true),
            ("\\*", "*", true),
            ("\\*", "x", false),
            ("registry", "Registry", false),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbx", false),
            ("a**", "a", true),
        ];
        for (pattern, label, expected) in cases {
            assert_eq!(matches(pattern, label), expected, "{pattern:?} against {label:?}");
        }
    }

    #[test]
    fn many_stars_against_a_long_label_answer_at_once() {
        let pattern = "*a".repeat(40) + "b";
        let label = "a".repeat(4000);
        assert!(!matches(&pattern, &label));
    }

    #[test]
    fn a_malformed_pattern_matches_nothing() {
        for pattern in ["[", "[a", "[]", "a\\", "[a-]", "x[", "*["] {
            assert!(!matches(pattern, "a"), "{pattern:?}");
            assert!(!matches(pattern, pattern), "{pattern:?} against itself");
        }
    }
}
