//! The config file (`cri_imaged::config::file`): any text read as `--config FILE`. A file that
//! loads gives `serve` flags its own parser takes, whatever the command line gave; one that does
//! not is refused with a reason, never a panic.
//!
//! Input: the file's text.
#![no_main]

use std::{ffi::OsString, path::Path, sync::LazyLock};

use clap::{CommandFactory, Parser};
use cri_imaged::config::{Cli, Command, file};
use libfuzzer_sys::fuzz_target;

/// The `serve` command, built once: building it is most of an execution otherwise.
static SERVE: LazyLock<clap::Command> =
    LazyLock::new(|| Cli::command().find_subcommand("serve").expect("the serve command").clone());

fuzz_target!(|data: &[u8]| {
    // `read` takes the file as UTF-8 text; other bytes are refused before parsing.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let serve = &*SERVE;
    let path = Path::new("cri-imaged.yaml");

    let loaded = file::parse(path, text, serve, |_| false);
    // Whether the file is usable does not depend on the command line, which only leaves out
    // the fields it gave.
    let beside_every_flag = file::parse(path, text, serve, |_| true);
    match (&loaded, &beside_every_flag) {
        (Ok(_), Ok((args, _))) => assert!(args.is_empty(), "the command line wins every field: {args:?}"),
        (Err(first), Err(again)) => assert_eq!(first.to_string(), again.to_string()),
        _ => panic!("the verdict changed with the command line: {loaded:?} / {beside_every_flag:?}"),
    }

    let args = match loaded {
        // The origins (which line set each flag) are for error messages; the flags are checked here.
        Ok((args, _)) => args,
        Err(error) => {
            if let file::FileError::UnknownField { at, .. } | file::FileError::Value { at, .. } = &error {
                let lines = text.lines().count().max(1);
                assert!(at.line.is_none_or(|line| (1..=lines).contains(&line)), "{error}: of {lines} lines");
            }
            return;
        }
    };
    for arg in &args {
        let arg = arg.to_str().expect("flags are built from UTF-8 text");
        let field = arg.strip_prefix("--").and_then(|arg| arg.split_once('=')).map(|(field, _)| field);
        assert!(
            field.is_some_and(|field| serve.get_arguments().any(|flag| flag.get_long() == Some(field))),
            "{arg:?} is a serve flag"
        );
    }

    // What the file gave, the command line takes, as it does at start and on each reload.
    let argv = ["cri-imaged", "serve"].map(OsString::from).into_iter().chain(args);
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(error) => panic!("a file that loads gives flags clap refuses: {}", error.render()),
    };
    let Command::Serve(serve) = cli.command else { panic!("a `serve` command line parsed as another command") };
    // Flags that clash (backoff initial above max, a GC low threshold above the high) are refused
    // when the daemon builds from them; that must answer, never panic.
    let _ = serve.manager_config();
    let _ = serve.gc_config();
    let _ = serve.credential_providers();
    let _ = serve.serve_limits();
});
