use std::time::{Duration, UNIX_EPOCH};

use ratatui::{Terminal, backend::TestBackend, buffer::Buffer};

use super::*;
use crate::{
    api,
    cli::top::model::{Reply, Update},
};

const MB: u64 = 1_000_000;
const SOCKET: &str = "/run/cri-imaged/cri-imaged.sock";

/// 2023-11-14T22:13:20Z, plus `seconds`.
fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
}

fn stamp(seconds: u64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds: 1_700_000_000 + seconds as i64, nanos: 0 })
}

/// The screen's cells after drawing `model` at `now` on an 80×24 terminal.
fn draw_at(model: &Model, now: SystemTime) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).expect("a test terminal");
    terminal.draw(|frame| draw(frame, model, now)).expect("drawn");
    terminal.backend().buffer().clone()
}

fn rows(buffer: &Buffer) -> Vec<String> {
    let width = usize::from(buffer.area.width);
    buffer.content.chunks(width).map(|row| row.iter().map(|cell| cell.symbol()).collect::<String>()).collect()
}

fn row_with<'a>(rows: &'a [String], text: &str) -> &'a str {
    rows.iter().find(|row| row.contains(text)).unwrap_or_else(|| panic!("no row with {text:?}:\n{}", rows.join("\n")))
}

/// A daemon answering: a pull a third done, another waiting for a slot, the disk at 62%.
fn answering() -> Model {
    let mut model = Model::new(SOCKET.to_owned(), String::new());
    model.update(Update::Connected, at(0));
    let status = api::GetStatusResponse {
        version: "1.4.0".to_owned(),
        runtime_reachable: true,
        pulls: vec![
            api::PullInFlight {
                image: "registry.local:5000/big:v1".to_owned(),
                callers: 2,
                asked: stamp(0),
                started: stamp(1),
                state: "pulling".to_owned(),
                progress: Some(api::PullProgress {
                    bytes_done: 12_300_000,
                    bytes_total: 33_600_000,
                    bytes_per_second: 2 * MB,
                    ..Default::default()
                }),
                ..Default::default()
            },
            api::PullInFlight {
                image: "busybox:1.36".to_owned(),
                callers: 1,
                asked: stamp(5),
                state: "slot".to_owned(),
                ..Default::default()
            },
        ],
        pulls_queued: 1,
        image_fs: Some(api::ImageFsUsage {
            capacity_bytes: 100_000 * MB,
            available_bytes: 38_000 * MB,
            usage_percent: 62,
        }),
        gc_high_threshold_percent: 85,
        gc_low_threshold_percent: 80,
        rate_limit_mode: "wait".to_owned(),
        rate_limits: vec![api::RateLimitBucket { qps: 5.0, burst: 10, tokens: 10.0, ..Default::default() }],
        ..Default::default()
    };
    model.update(Update::Status(Box::new(status)), at(20));
    let backoff = api::BackoffEntry {
        pod: Some(api::PodRef { namespace: "shop".to_owned(), name: "web-7d9f".to_owned(), ..Default::default() }),
        image: "registry.local:5000/missing:v2".to_owned(),
        retry_after: Some(prost_types::Duration { seconds: 40, nanos: 0 }),
        last_error: "ErrImagePull: not found".to_owned(),
        ..Default::default()
    };
    let list = api::ListBackoffsResponse { entries: vec![backoff], total: 1 };
    model.update(Update::Backoffs(Reply::Got(list)), at(20));
    let pulled = api::Event {
        time: stamp(18),
        r#type: "Normal".to_owned(),
        reason: "Pulled".to_owned(),
        message: "Successfully pulled image \"busybox:1.35\" in 1.2s".to_owned(),
        pod: Some(api::PodRef { namespace: "shop".to_owned(), name: "cart-1".to_owned(), ..Default::default() }),
        image: "busybox:1.35".to_owned(),
        ..Default::default()
    };
    model.update(Update::History(Reply::Got(vec![pulled])), at(20));
    model
}

#[test]
fn a_pull_shows_its_bar_bytes_rate_and_time_left() {
    let screen = rows(&draw_at(&answering(), at(25)));
    assert!(screen[0].starts_with(" cri-imaged 1.4.0  /run/cri-imaged/cri-imaged.sock  runtime ok"), "{screen:#?}");
    assert!(screen[0].ends_with("22:13:45 UTC "), "{screen:#?}");
    assert_eq!(row_with(&screen, "Pulls").trim_end(), "Pulls  1 under way, 1 queued");
    let name = row_with(&screen, "big:v1");
    assert!(
        name.starts_with("  registry.local:5000/big:v1") && name.trim_end().ends_with("pulling  2 callers  25s"),
        "{name}"
    );
    let bar = row_with(&screen, "12.3 MB / 33.6 MB");
    assert!(bar.starts_with("    [=========> "), "{bar}");
    assert!(bar.trim_end().ends_with("]  36%  12.3 MB / 33.6 MB  2.00 MB/s  11s left"), "{bar}");
    assert_eq!(bar.trim_end().chars().count(), 80, "the bar takes the width left");
    let waiting = row_with(&screen, "busybox:1.36");
    assert!(waiting.trim_end().ends_with("waiting for a slot  1 caller  20s"), "{waiting}");
}

#[test]
fn a_backoff_counts_down_to_its_retry() {
    let model = answering();
    let backoff = |now| row_with(&rows(&draw_at(&model, now)), "shop/web-7d9f").to_owned();
    assert!(
        backoff(at(20)).contains("shop/web-7d9f  registry.local:5000/missing:v2  retry in 40s"),
        "{}",
        backoff(at(20))
    );
    assert!(backoff(at(45)).contains("retry in 15s"), "{}", backoff(at(45)));
    assert!(backoff(at(61)).contains("retry due"), "{}", backoff(at(61)));
    assert!(backoff(at(20)).contains("retry in 40s    ErrImagePull: n"), "the error takes the rest of the row");
}

#[test]
fn the_disk_gauge_marks_the_gc_thresholds_where_they_fall() {
    let buffer = draw_at(&answering(), at(25));
    let screen = rows(&buffer);
    let disk = row_with(&screen, "disk [");
    let tail = "]  62%  62.0 GB of 100 GB  GC 85%→80%";
    assert!(disk.trim_end().ends_with(tail), "{disk}");
    let inner: String = disk.chars().skip("disk [".len()).take(80 - "disk [".len() - tail.chars().count()).collect();
    let cell = |percent: usize| percent * inner.len() / 100;
    assert_eq!(inner.chars().nth(cell(85)), Some('|'), "high mark: {inner:?}");
    assert_eq!(inner.chars().nth(cell(80)), Some(':'), "low mark: {inner:?}");
    let used = inner.chars().take_while(|c| *c == '=').count();
    assert_eq!(used, (62 * inner.len()).div_ceil(100), "filled to the usage: {inner:?}");
    assert!(inner[used..cell(80)].chars().all(|c| c == ' '), "{inner:?}");
    let y = screen.iter().position(|row| row.starts_with("disk [")).expect("the disk row") as u16;
    let high = (6 + cell(85)) as u16;
    assert_eq!(buffer[(high, y)].fg, Color::Red, "the high threshold stands out");
}

#[test]
fn an_unreachable_daemon_is_a_banner_over_its_last_answers_dimmed() {
    let mut model = answering();
    let lost = Update::Lost {
        attempt: 3,
        error: format!("nothing is listening on {SOCKET}"),
        retry_in: Duration::from_secs(1),
    };
    model.update(lost, at(30));
    let buffer = draw_at(&model, at(30));
    let screen = rows(&buffer);
    assert_eq!(screen[1].trim_end(), format!("daemon unreachable at {SOCKET}: reconnecting (attempt 3)…"));
    assert!(screen[2].starts_with("next try in 1.0s; nothing is listening on"), "{screen:#?}");
    assert!(row_with(&screen, "Pulls").contains("(stale: as of 22:13:40)"), "{screen:#?}");
    assert!(row_with(&screen, "shop/web-7d9f").contains("retry in 30s"), "the countdown goes on");
    let y = screen.iter().position(|row| row.contains("big:v1")).expect("the pull stays") as u16;
    assert!(buffer[(4, y)].modifier.contains(Modifier::DIM), "the last answers are dimmed");
    assert!(screen[23].contains("stale: as of 22:13:40"), "{screen:#?}");
}

#[test]
fn panes_an_older_daemon_does_not_serve_say_so() {
    let mut model = answering();
    model.update(Update::Backoffs(Reply::Unimplemented), at(21));
    model.update(Update::History(Reply::Unimplemented), at(21));
    let screen = rows(&draw_at(&model, at(21)));
    assert!(row_with(&screen, "Backoffs").trim_end() == "Backoffs", "{screen:#?}");
    assert_eq!(row_with(&screen, "ListBackoffs").trim(), "not served by this daemon (ListBackoffs)");
    assert!(row_with(&screen, "Events").contains("history not served by this daemon"), "{screen:#?}");
}

#[test]
fn the_filter_hides_other_images_and_is_shown_in_the_footer() {
    let mut model = answering();
    model.filter = "BIG".to_owned();
    let screen = rows(&draw_at(&model, at(25)));
    assert!(screen.iter().any(|row| row.contains("big:v1")));
    assert!(!screen.iter().any(|row| row.contains("busybox")), "{screen:#?}");
    assert!(row_with(&screen, "Pulls").contains("1 hidden by the filter"));
    assert!(
        row_with(&screen, "Backoffs").contains("1 backing off")
            && row_with(&screen, "no pod's pulls").starts_with("  ")
    );
    assert!(
        screen[23].starts_with("q quit  / filter  p pause") && screen[23].contains("filter: BIG"),
        "{}",
        screen[23]
    );
    model.typing = Some("bus".to_owned());
    let screen = rows(&draw_at(&model, at(25)));
    assert!(screen[23].starts_with("filter: bus_  Enter applies, Esc cancels"), "{}", screen[23]);
}

#[test]
fn many_pulls_fit_80_by_24_with_the_rest_counted() {
    let mut model = answering();
    let Some((status, _)) = model.status.as_mut() else { panic!("a status") };
    status.pulls = (0..12)
        .map(|n| api::PullInFlight {
            image: format!("img-{n}:v1"),
            callers: 1,
            state: "slot".to_owned(),
            ..Default::default()
        })
        .collect();
    let screen = rows(&draw_at(&model, at(25)));
    assert!(row_with(&screen, "more").trim_end().ends_with("… and 4 more"), "{screen:#?}");
    for pane in ["Backoffs", "Registries", "Events"] {
        row_with(&screen, pane);
    }
    assert!(row_with(&screen, "Pulled").contains("22:13:38 Pulled         shop/cart-1  Successfully pulled"));
}

#[test]
fn rows_go_to_headings_first_then_pulls_backoffs_registries_and_events_the_rest() {
    assert_eq!(split(19, [5, 3, 2, 4]), [5, 3, 2, 9]);
    assert_eq!(split(19, [30, 3, 2, 4]), [9, 3, 2, 5], "pulls take at most half");
    assert_eq!(split(6, [30, 30, 30, 30]), [2, 2, 2, 0], "a tiny terminal shows what it can");
}

#[test]
fn the_daemons_text_in_every_pane_is_shown_never_acted_on() {
    use crate::cli::render::{
        hostile::{hostile, shown},
        line::acted_on,
    };
    let mut model = Model::new(hostile("socket"), String::new());
    model.update(Update::Connected, at(0));
    let status = api::GetStatusResponse {
        version: hostile("version"),
        pulls: vec![api::PullInFlight { image: hostile("pull"), state: hostile("state"), ..Default::default() }],
        rate_limit_mode: hostile("mode"),
        rate_limits: vec![api::RateLimitBucket {
            host: hostile("bucket"),
            lowered_from_qps: 1.0,
            ..Default::default()
        }],
        registries: vec![api::RegistryHealth {
            host: hostile("registry"),
            breaker: hostile("breaker"),
            last_failure: hostile("failure"),
            ..Default::default()
        }],
        ..Default::default()
    };
    model.update(Update::Status(Box::new(status)), at(1));
    let pod = api::PodRef { namespace: hostile("ns"), name: hostile("name"), ..Default::default() };
    let backoff = api::BackoffEntry {
        pod: Some(pod.clone()),
        image: hostile("image"),
        last_error: hostile("error"),
        ..Default::default()
    };
    model.update(Update::Backoffs(Reply::Got(api::ListBackoffsResponse { entries: vec![backoff], total: 1 })), at(1));
    let event = api::Event {
        r#type: "Warning".to_owned(),
        reason: hostile("reason"),
        message: hostile("message"),
        pod: Some(pod),
        ..Default::default()
    };
    model.update(Update::History(Reply::Got(vec![event])), at(1));
    let mut terminal = Terminal::new(TestBackend::new(2000, 30)).expect("a test terminal");
    terminal.draw(|frame| draw(frame, &model, at(2))).expect("drawn");
    let screen = rows(terminal.backend().buffer()).join("\n");
    assert!(!screen.chars().any(|c| c != '\n' && acted_on(c)), "{screen:?}");
    for field in ["version", "pull", "state", "mode", "bucket", "registry", "breaker", "failure", "error"] {
        assert!(screen.contains(&shown(field)), "{field} shown whole:\n{screen}");
    }
    // The backoff's pod and image are cut to their columns, the event's line to the screen: their
    // starts are shown.
    for field in ["ns", "image", "reason", "message"] {
        let start: String = shown(field).chars().take(16).collect();
        assert!(screen.contains(&start), "{field} shown:\n{screen}");
    }

    model.update(Update::Lost { attempt: 1, error: hostile("lost"), retry_in: Duration::from_secs(1) }, at(3));
    model.typing = Some(hostile("typed"));
    terminal.draw(|frame| draw(frame, &model, at(3))).expect("drawn");
    let screen = rows(terminal.backend().buffer()).join("\n");
    assert!(!screen.chars().any(|c| c != '\n' && acted_on(c)), "{screen:?}");
    assert!(screen.contains(&shown("lost")) && screen.contains(&shown("typed")), "{screen}");
}
