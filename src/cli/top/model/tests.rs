use std::time::UNIX_EPOCH;

use crossterm::event::KeyEvent;

use super::*;

fn at(seconds: f64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_secs_f64(seconds)
}

fn stamp(seconds: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: 1_700_000_000 + seconds as i64, nanos: 0 }
}

fn model() -> Model {
    Model::new("/run/cri-imaged/cri-imaged.sock".to_owned(), String::new())
}

fn press(model: &mut Model, code: KeyCode) -> Flow {
    model.key(KeyEvent::new(code, KeyModifiers::NONE), at(0.0))
}

fn typed(model: &mut Model, text: &str) {
    for c in text.chars() {
        press(model, KeyCode::Char(c));
    }
}

fn status(version: &str) -> Update {
    let answer = api::GetStatusResponse { version: version.to_owned(), runtime_reachable: true, ..Default::default() };
    Update::Status(Box::new(answer))
}

fn event(second: u64, reason: &str, image: &str) -> api::Event {
    api::Event {
        time: Some(stamp(second)),
        r#type: "Normal".to_owned(),
        reason: reason.to_owned(),
        message: format!("{reason} {image}"),
        image: image.to_owned(),
        ..Default::default()
    }
}

fn lost(attempt: u32) -> Update {
    Update::Lost { attempt, error: "nothing is listening".to_owned(), retry_in: reconnect_wait(attempt) }
}

#[test]
fn reconnect_waits_double_from_a_quarter_second_to_five_seconds() {
    let waits: Vec<u128> = (1..=8).map(|attempt| reconnect_wait(attempt).as_millis()).collect();
    assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
    assert_eq!(reconnect_wait(u32::MAX), Duration::from_secs(5));
}

#[test]
fn a_lost_daemon_keeps_its_last_answers_marked_stale_until_it_is_back() {
    let mut model = model();
    assert_eq!(model.banner(at(0.0)), Some(Banner::Note("connecting to /run/cri-imaged/cri-imaged.sock…".to_owned())));
    model.update(Update::Connected, at(0.0));
    model.update(status("1.0"), at(0.0));
    assert!(!model.stale());
    assert_eq!(model.banner(at(0.5)), None, "a first connect is not a reconnect");

    model.update(lost(1), at(1.0));
    model.update(lost(2), at(1.25));
    assert!(model.stale());
    assert_eq!(model.status.as_ref().map(|(status, _)| status.version.as_str()), Some("1.0"), "the last answer stays");
    let Some(Banner::Alert { text, detail }) = model.banner(at(1.25)) else { panic!("an alert") };
    assert_eq!(text, "daemon unreachable at /run/cri-imaged/cri-imaged.sock: reconnecting (attempt 2)…");
    assert_eq!(detail, "next try in 0.5s; nothing is listening");

    model.update(Update::Connected, at(2.0));
    model.update(status("1.1"), at(2.0));
    assert!(!model.stale());
    assert_eq!(
        model.banner(at(4.9)),
        Some(Banner::Good("reconnected to the daemon at /run/cri-imaged/cri-imaged.sock".to_owned()))
    );
    assert_eq!(model.banner(at(5.0)), None, "said briefly: {RECONNECTED_FOR:?}");
    assert_eq!(model.status.as_ref().map(|(status, _)| status.version.as_str()), Some("1.1"));
}

#[test]
fn a_runtime_that_does_not_answer_is_told_under_the_header() {
    let mut model = model();
    model.update(Update::Connected, at(0.0));
    let answer = api::GetStatusResponse { runtime_error: "connection refused".to_owned(), ..Default::default() };
    model.update(Update::Status(Box::new(answer)), at(0.0));
    assert_eq!(model.banner(at(0.0)), Some(Banner::Warn("the runtime does not answer: connection refused".to_owned())));
}

#[test]
fn backoffs_count_down_from_their_answer_and_stop_while_paused() {
    let mut model = model();
    let entry = api::BackoffEntry {
        image: "web:1".to_owned(),
        retry_after: Some(prost_types::Duration { seconds: 10, nanos: 0 }),
        ..Default::default()
    };
    let list = api::ListBackoffsResponse { entries: vec![entry.clone()], total: 1 };
    model.update(Update::Backoffs(Reply::Got(list)), at(100.0));
    assert_eq!(model.retry_in(&entry, at(103.5)), Duration::from_millis(6500));
    assert_eq!(model.retry_in(&entry, at(130.0)), Duration::ZERO, "due, never negative");
    model.key(KeyEvent::new(KeyCode::Char('p'), KeyModifiers::NONE), at(104.0));
    assert_eq!(model.retry_in(&entry, at(109.0)), Duration::from_secs(6), "frozen at the pause");
}

#[test]
fn an_older_daemon_is_remembered_as_not_serving_a_pane() {
    let mut model = model();
    model.update(Update::Backoffs(Reply::Unimplemented), at(0.0));
    model.update(Update::History(Reply::Unimplemented), at(0.0));
    assert!(matches!(model.backoffs, Reply::Unimplemented));
    assert!(matches!(model.history, Reply::Unimplemented));
}

#[test]
fn a_slash_types_a_filter_that_enter_applies_and_esc_cancels() {
    let mut model = Model::new("s".to_owned(), "web".to_owned());
    assert!(model.shows("registry/WEB:1") && !model.shows("db:1"), "any case");
    assert_eq!(press(&mut model, KeyCode::Char('/')), Flow::Go);
    assert_eq!(model.typing.as_deref(), Some("web"), "starts from the filter applied");
    press(&mut model, KeyCode::Backspace);
    press(&mut model, KeyCode::Backspace);
    press(&mut model, KeyCode::Backspace);
    typed(&mut model, "db q/p");
    assert_eq!(model.typing.as_deref(), Some("db q/p"), "keys are text while typing");
    assert_eq!(model.filter, "web", "not applied before Enter");
    assert_eq!(press(&mut model, KeyCode::Esc), Flow::Go, "Esc cancels typing, it does not quit");
    assert_eq!((model.filter.as_str(), model.typing.as_deref()), ("web", None));

    press(&mut model, KeyCode::Char('/'));
    press(&mut model, KeyCode::Backspace);
    press(&mut model, KeyCode::Backspace);
    press(&mut model, KeyCode::Backspace);
    typed(&mut model, "db");
    press(&mut model, KeyCode::Enter);
    assert_eq!((model.filter.as_str(), model.typing.as_deref()), ("db", None));
    assert!(model.shows("db:1") && !model.shows("web:1"));

    press(&mut model, KeyCode::Char('/'));
    press(&mut model, KeyCode::Backspace);
    press(&mut model, KeyCode::Backspace);
    press(&mut model, KeyCode::Enter);
    assert!(model.shows("anything"), "an empty filter shows all");
}

#[test]
fn q_esc_and_ctrl_c_quit() {
    assert_eq!(press(&mut model(), KeyCode::Char('q')), Flow::Quit);
    assert_eq!(press(&mut model(), KeyCode::Esc), Flow::Quit);
    let mut typing = model();
    press(&mut typing, KeyCode::Char('/'));
    assert_eq!(typing.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL), at(0.0)), Flow::Quit);
    assert_eq!(press(&mut model(), KeyCode::Char('x')), Flow::Go);
}

#[test]
fn a_pause_holds_the_daemons_data_but_not_the_link_and_resuming_applies_it() {
    let mut model = model();
    model.update(Update::Connected, at(0.0));
    model.update(status("1.0"), at(0.0));
    press(&mut model, KeyCode::Char('p'));
    assert!(model.paused.is_some());
    model.update(status("1.1"), at(1.0));
    model.update(Update::Event(Box::new(event(1, "Pulled", "web:1"))), at(1.0));
    model.update(lost(1), at(2.0));
    assert_eq!(model.status.as_ref().map(|(status, _)| status.version.as_str()), Some("1.0"), "held");
    assert!(model.events.is_empty(), "held");
    assert!(model.stale(), "the link is told at once");
    press(&mut model, KeyCode::Char('p'));
    assert!(model.paused.is_none());
    assert_eq!(model.status.as_ref().map(|(status, _)| status.version.as_str()), Some("1.1"));
    assert_eq!(model.events.len(), 1);
}

#[test]
fn events_are_kept_once_oldest_first_whether_live_or_from_the_history() {
    let mut model = model();
    model.update(Update::Event(Box::new(event(5, "Pulling", "web:1"))), at(5.0));
    let history = vec![event(3, "Pulled", "db:1"), event(5, "Pulling", "web:1")];
    model.update(Update::History(Reply::Got(history.clone())), at(6.0));
    model.update(Update::Event(Box::new(event(7, "Pulled", "web:1"))), at(7.0));
    // After a short loss the same daemon's history comes again.
    model.update(Update::History(Reply::Got(history)), at(8.0));
    let seen: Vec<(&str, &str)> =
        model.events.iter().map(|event| (event.reason.as_str(), event.image.as_str())).collect();
    assert_eq!(seen, [("Pulled", "db:1"), ("Pulling", "web:1"), ("Pulled", "web:1")]);
    for n in 0..300 {
        model.update(Update::Event(Box::new(event(10 + n, "Pulled", "x:1"))), at(9.0));
    }
    assert_eq!(model.events.len(), EVENTS_KEPT);
}

#[test]
fn progress_events_move_their_pulls_bar_without_filling_the_events_pane() {
    let mut model = model();
    let pull = api::PullInFlight { image: "web:1".to_owned(), ..Default::default() };
    let answer = api::GetStatusResponse { pulls: vec![pull], ..Default::default() };
    model.update(Update::Status(Box::new(answer)), at(0.0));
    let mut progress = event(1, "PullProgress", "web:1");
    progress.progress = Some(api::PullProgress { bytes_done: 5, bytes_total: 10, ..Default::default() });
    model.update(Update::Event(Box::new(progress)), at(1.0));
    assert!(model.events.is_empty());
    let pulls = &model.status.as_ref().expect("a status").0.pulls;
    assert_eq!(pulls[0].progress.as_ref().map(|p| (p.bytes_done, p.bytes_total)), Some((5, 10)));
}
