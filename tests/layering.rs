//! The shape of `src/`, as the book's layout chapter (docs/contributing/layout.md) draws it: the
//! crate's top modules import one another without a circle, nothing below the composition root
//! (`daemon`) imports it, only the composition root imports the metrics aggregate (each concern's metrics use the
//! `metric_labels` leaf), no two files of `src/` import each other (nor through others), and no
//! source file grows past what reads in one sitting.
//!
//! An import is any `crate::module` path in a file, doc links included: a link is an arrow a
//! reader follows too.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// The longest a source file may be, tests aside.
const MOST_LINES: usize = 450;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top module a file belongs to: `src/pull/scheduler.rs` and `src/pull.rs` are `pull`.
fn top_module(file: &Path) -> String {
    let relative = file.strip_prefix(src()).expect("under src/");
    let first = relative.components().next().expect("a path").as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top modules `text` names after `crate::`, in plain paths and in `crate::{…}` groups.
fn imported_modules(text: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        // `cri_imaged::crate::` cannot happen; `$crate::` in macros is not an import.
        if text[..at].ends_with('$') {
            continue;
        }
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            modules.extend(group_heads(group));
        } else {
            let name: String = rest.chars().take_while(|&c| is_identifier_char(c)).collect();
            if !name.is_empty() {
                modules.insert(name);
            }
        }
    }
    modules
}

/// The first segment of each item in a `{…}` group (its text after the opening brace).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut item_start) = (0usize, true);
    let mut chars = group.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && depth == 0 && is_identifier_char(c) => {
                let name: String = group[at..].chars().take_while(|&c| is_identifier_char(c)).collect();
                for _ in 1..name.chars().count() {
                    chars.next();
                }
                if name != "self" {
                    heads.push(name);
                }
                item_start = false;
            }
            _ => {}
        }
    }
    heads
}

/// Which top modules each top module imports (itself left out).
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(&src()) {
        let module = top_module(&file);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = fs::read_to_string(&file).expect("a source file reads");
        let imports = graph.entry(module.clone()).or_default();
        imports.extend(imported_modules(&text).into_iter().filter(|name| *name != module));
    }
    graph
}

/// A circle of imports, if there is one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|seen| seen == module) {
            let mut circle = path[start..].to_vec();
            circle.push(module.to_owned());
            return Some(circle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

/// A file's module path: `src/policy/sigstore/bundle.rs` is `policy::sigstore::bundle`,
/// `src/pull/mod.rs` is `pull`.
fn module_path(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src()).expect("under src/").with_extension("");
    let mut path: Vec<String> =
        relative.components().map(|part| part.as_os_str().to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    path
}

/// The paths a `use` tree names, its text after the first `::`: `a::{b, c::d}` is `a::b`, `a::c::d`.
fn tree_paths(text: &str) -> Vec<Vec<String>> {
    /// Reads one tree after `prefix`, returning how much of `text` it took.
    fn walk(text: &str, prefix: &[String], paths: &mut Vec<Vec<String>>) -> usize {
        let mut path = prefix.to_vec();
        let mut at = 0;
        loop {
            if text[at..].starts_with('{') {
                // A group: each item a tree of its own after the path so far, up to its `}`.
                at += 1;
                loop {
                    at += text[at..].len() - text[at..].trim_start().len();
                    // Past its `}` (a file cut short ends it too).
                    if at >= text.len() || text[at..].starts_with('}') {
                        return (at + 1).min(text.len());
                    }
                    at += walk(&text[at..], &path, paths);
                    at += text[at..].len() - text[at..].trim_start().len();
                    if !text[at..].starts_with(',') {
                        return (at + 1).min(text.len());
                    }
                    at += 1;
                }
            }
            let name: String = text[at..].chars().take_while(|&c| is_identifier_char(c)).collect();
            at += name.len();
            if !name.is_empty() && name != "self" {
                path.push(name);
            }
            if text[at..].starts_with("::") {
                at += 2;
            } else {
                paths.push(path);
                return at;
            }
        }
    }
    let mut paths = Vec::new();
    walk(text, &[], &mut paths);
    paths
}

/// `text`'s code: comment lines and inline `#[cfg(test)] mod … { … }` blocks left out.
fn code_of(text: &str) -> String {
    let mut code: String =
        text.lines().filter(|line| !line.trim_start().starts_with("//")).map(|line| format!("{line}\n")).collect();
    while let Some(at) = code.find("#[cfg(test)]") {
        let after = code[at + "#[cfg(test)]".len()..].trim_start();
        let Some(block) = after.strip_prefix("mod ").and_then(|rest| {
            let open = rest.find(['{', ';'])?;
            (rest.as_bytes()[open] == b'{').then(|| &rest[open..])
        }) else {
            code.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        };
        let mut depth = 0usize;
        let close = block
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(block.len(), |(close, _)| close + 1);
        let end = code.len() - block.len() + close;
        code.replace_range(at..end, "");
    }
    code
}

/// The module paths `text` (the file of `module`) names with `crate::`, `super::` or `self::`.
fn named_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut named = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in text.match_indices(start) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| is_identifier_char(c) || c == ':' || c == '$') {
                continue;
            }
            // `self` in a file is the file's module; `super` its parent (a `mod.rs`-less
            // `a/b.rs` is module `a::b`, whose `super` is `a`).
            let mut base: Vec<String> = match start {
                "crate::" => Vec::new(),
                _ => module.to_vec(),
            };
            let mut rest = &text[at + start.len()..];
            if start == "super::" {
                base.pop();
                while let Some(more) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = more;
                }
            }
            for path in tree_paths(rest) {
                named.push(base.iter().cloned().chain(path).collect());
            }
        }
    }
    named
}

/// Which files of `src/` each file's code imports, by the longest module path a named path starts
/// with. Left out: a module's own file naming its descendants (`mod` and `pub use self::…`
/// re-exports are its face, not a dependence), doc links (a pointer to read on), and test code
/// (a test may use its siblings' test helpers).
fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files: BTreeMap<Vec<String>, String> = sources(&src())
        .into_iter()
        .filter(|file| !file.ends_with("lib.rs") && !file.ends_with("main.rs"))
        .filter(|file| !file.components().any(|part| part.as_os_str() == "tests") && !file.ends_with("tests.rs"))
        .map(|file| {
            let shown = file.strip_prefix(src()).expect("under src/").to_string_lossy().into_owned();
            (module_path(&file), shown)
        })
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, shown) in &files {
        let text = code_of(&fs::read_to_string(src().join(shown)).expect("a source file reads"));
        let imports = graph.entry(shown.clone()).or_default();
        for path in named_paths(&text, module) {
            let target = (1..=path.len()).rev().find_map(|length| {
                let prefix = &path[..length];
                files.get(prefix).map(|file| (prefix, file))
            });
            if let Some((prefix, file)) = target
                && file != shown
                && !prefix.starts_with(module)
            {
                imports.insert(file.clone());
            }
        }
    }
    graph
}

#[test]
fn the_import_reader_sees_paths_groups_and_doc_links() {
    let text = "use crate::{\n    api,\n    pull::{Pull, path::PullPath},\n    self,\n};\n/// See [`crate::presence`].\nlet x = crate::messages::echo(y);";
    let found: Vec<String> = imported_modules(text).into_iter().collect();
    assert_eq!(found, ["api", "messages", "presence", "pull"]);
}

#[test]
fn the_top_modules_import_one_another_without_a_circle() {
    let graph = import_graph();
    assert!(graph.len() > 20, "the crate's modules were found: {:?}", graph.keys());
    assert_eq!(find_circle(&graph), None, "a circle of imports");
}

#[test]
fn the_file_import_reader_follows_groups_super_and_self() {
    let text = "use super::{\n    artifact::{A, B},\n    verify::{self, C},\n    D,\n};\nuse crate::policy::{X, scope::shown};";
    let module = ["policy".to_owned(), "sigstore".to_owned(), "bundle".to_owned()];
    let found: BTreeSet<String> = named_paths(text, &module).into_iter().map(|path| path.join("::")).collect();
    let expected = [
        "policy::X",
        "policy::scope::shown",
        "policy::sigstore::D",
        "policy::sigstore::artifact::A",
        "policy::sigstore::artifact::B",
        "policy::sigstore::verify",
        "policy::sigstore::verify::C",
    ];
    assert_eq!(found, expected.iter().map(|path| path.to_string()).collect());
}

#[test]
fn the_file_import_reader_leaves_out_comments_and_test_modules() {
    let text = "/// [`super::a`]\nuse super::b;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod tests {\n    use super::c::{d};\n}\nuse super::e;";
    let module = ["m".to_owned(), "f".to_owned()];
    let found: Vec<String> = named_paths(&code_of(text), &module).into_iter().map(|path| path.join("::")).collect();
    assert_eq!(found, ["m::b", "m::e"]);
}

#[test]
fn a_use_tree_cut_short_is_read_without_a_panic() {
    let module = ["m".to_owned()];
    let found: Vec<String> =
        named_paths("use crate::{a::{b", &module).into_iter().map(|path| path.join("::")).collect();
    assert_eq!(found, ["a::b"]);
}

#[test]
fn no_two_files_import_each_other() {
    let graph = file_graph();
    assert!(graph.len() > 100, "the crate's files were found: {}", graph.len());
    assert_eq!(find_circle(&graph), None, "a circle of imports between files of src/");
}

#[test]
fn a_made_up_circle_is_found() {
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(find_circle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

#[test]
fn only_the_composition_root_imports_it_and_the_metrics_aggregate() {
    let graph = import_graph();
    for (module, imports) in &graph {
        assert!(!imports.contains("daemon"), "{module} imports the composition root");
        if module != "daemon" {
            assert!(!imports.contains("metrics"), "{module} imports the metrics aggregate; use metric_labels");
        }
    }
    assert!(graph["daemon"].contains("metrics"), "the composition root builds the metrics");
}

#[test]
fn the_commands_for_people_use_only_the_api_the_flags_the_pure_grammars_and_the_file_reader() {
    let graph = import_graph();
    let allowed = ["api", "config", "reference", "duration", "files"];
    let reaching: Vec<&String> = graph["cli"].iter().filter(|module| !allowed.contains(&module.as_str())).collect();
    assert!(reaching.is_empty(), "cli reaches into the daemon's parts: {reaching:?}");
    let importers: Vec<&String> =
        graph.iter().filter(|(_, imports)| imports.contains("cli")).map(|(module, _)| module).collect();
    assert!(importers.is_empty(), "the daemon's parts import the commands for people: {importers:?}");
}

#[test]
fn no_source_file_is_longer_than_reads_in_one_sitting() {
    let too_long: Vec<(PathBuf, usize)> = sources(&src())
        .into_iter()
        .filter(|file| {
            let under_tests = file.components().any(|part| part.as_os_str() == "tests");
            !under_tests && file.file_name().is_some_and(|name| name != "tests.rs")
        })
        .map(|file| {
            let lines = fs::read_to_string(&file).expect("a source file reads").lines().count();
            (file, lines)
        })
        .filter(|(_, lines)| *lines > MOST_LINES)
        .collect();
    assert!(too_long.is_empty(), "over {MOST_LINES} lines: {too_long:?}");
}
