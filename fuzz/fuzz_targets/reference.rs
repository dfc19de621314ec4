//! Image references (`cri_imaged::reference`): the grammar, normalisation and the default tag,
//! as every image name a caller sends goes through them.
#![no_main]

use cri_imaged::reference::{self, DEFAULT_TAG, ImageReference};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Images arrive as protobuf strings, which are UTF-8.
    let Ok(text) = std::str::from_utf8(data) else { return };

    if let Ok(parsed) = ImageReference::parse(text) {
        // Parsing keeps every piece: the reference prints as it was written, and reads back.
        assert_eq!(parsed.to_string(), text, "Display gives back what parsed");
        assert_eq!(ImageReference::parse(text).as_ref(), Ok(&parsed), "parsing is deterministic");
        let _ = parsed.familiar_name();
    }

    let normalized = ImageReference::parse_normalized(text);
    if let Ok(normalized) = &normalized {
        // Its domain may still be "": as in Go, a first component that only looks like a domain
        // (`a_b.com/c`) is read back as part of the path.
        let shown = normalized.to_string();
        assert_eq!(ImageReference::parse(&shown).as_ref(), Ok(normalized), "{shown:?} reads back");
        assert_eq!(ImageReference::parse_normalized(&shown).as_ref(), Ok(normalized), "normalising is idempotent");
        let _ = normalized.familiar_name();
    }

    match reference::parse_with_default_tag(text) {
        Ok((parsed, tagged)) => {
            assert!(parsed.tag().is_some() || parsed.digest().is_some(), "a tag or a digest after defaulting");
            let expected = if normalized.as_ref().is_ok_and(|n| n.tag().is_none() && n.digest().is_none()) {
                format!("{text}:{DEFAULT_TAG}")
            } else {
                text.to_owned()
            };
            assert_eq!(tagged, expected);
            // The tagged image is what the runtime gets: it must parse to the same reference, and
            // defaulting again changes nothing.
            let (again, tagged_again) = reference::parse_with_default_tag(&tagged).expect("the tagged image parses");
            assert_eq!(again, parsed);
            assert_eq!(tagged_again, tagged);
            assert_eq!(reference::apply_default_tag(text).as_deref(), Ok(tagged.as_str()));
        }
        Err(error) => {
            assert_eq!(normalized.err(), Some(error.clone()), "only normalising fails");
            let _ = error.to_string();
        }
    }
});
