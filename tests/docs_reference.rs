//! The reference pages in `docs/reference/` are generated from the code that defines what they
//! list: each test here builds its page and fails, naming the first line that differs, when the
//! checked-in page is not what the code says. `UPDATE_DOCS=1 cargo test --test docs_reference`
//! writes the pages instead.

#[path = "docs_reference/config.rs"]
mod config;
#[path = "docs_reference/flags.rs"]
mod flags;
#[path = "docs_reference/markdown.rs"]
mod markdown;
#[path = "docs_reference/metrics.rs"]
mod metrics;
#[path = "docs_reference/reasons.rs"]
mod reasons;

use std::path::PathBuf;

/// The command that writes the pages again.
const UPDATE_COMMAND: &str = "UPDATE_DOCS=1 cargo test --test docs_reference";

/// Compares `generated` with `docs/reference/{name}`, or writes it there under `UPDATE_DOCS=1`.
fn check_page(name: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/reference").join(name);
    if std::env::var_os("UPDATE_DOCS").is_some_and(|value| !value.is_empty() && value != "0") {
        std::fs::write(&path, generated).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == generated {
        return;
    }
    let (mut page_lines, mut code_lines) = (current.lines(), generated.lines());
    let mut line = 1;
    loop {
        match (page_lines.next(), code_lines.next()) {
            (Some(page), Some(code)) if page == code => line += 1,
            (page, code) => panic!(
                "docs/reference/{name} differs from the code from line {line}:\n  page: {}\n  code: {}\n\
                 Run `{UPDATE_COMMAND}` and commit the page.",
                page.unwrap_or("(end of page)"),
                code.unwrap_or("(end of generated text)"),
            ),
        }
    }
}

#[test]
fn the_flags_page_lists_every_flag_as_clap_defines_it() {
    check_page("flags.md", &flags::page());
}

#[test]
fn the_config_page_lists_every_key_the_config_file_accepts() {
    check_page("config.md", &config::page());
}

#[test]
fn the_metrics_page_lists_every_registered_metric() {
    check_page("metrics.md", &metrics::page());
}

#[test]
fn the_reasons_page_lists_every_error_reason_and_its_code() {
    check_page("reasons.md", &reasons::page());
}
