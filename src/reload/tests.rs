use std::ffi::OsString;

use super::*;

#[test]
fn every_reloadable_flag_is_a_serve_flag() {
    let loaded = config::load(&["cri-imaged", "serve"].map(OsString::from)).expect("defaults load");
    for flag in RELOADABLE {
        assert!(loaded.values.knows(flag), "{flag} is not a serve flag");
    }
}
