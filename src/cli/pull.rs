//! `cri-imaged pull IMAGE`: EnsureImageExists as a pod's container would call it, with the pull's
//! progress drawn from the daemon's events while the call waits.

use std::{io::Write, time::Duration};

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{bytes, duration, short_id, wire_duration},
        line::{Line, printable},
        progress::{View, frame, plain_line},
    },
    secret,
};
use crate::{
    api,
    config::client::{PolicyArg, PullArgs},
    reference,
};

/// How often the frame is drawn again while nothing happens (the elapsed time moves), and the
/// daemon asked what a pull that moves no bytes waits for. GetStatus probes the runtime, so no
/// more often than this.
const TICK: Duration = Duration::from_secs(1);
/// How often plain output (a pipe, or `NO_COLOR`) prints a progress line.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

pub async fn run(args: PullArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let request = request(&args)?;
    let mut daemon = Daemon::connect(&args.connection).await?;
    // Watching before asking: the pull's first events are not missed.
    let filter = api::WatchEventsRequest { image: args.image.clone(), ..Default::default() };
    let watch = daemon.client.watch_events(filter).await;
    let mut events = daemon.answer(watch, "WatchEvents").await?;
    let mut client = daemon.client.clone();
    // The pull itself has no deadline: it takes as long as the image does.
    let call = client.ensure_image_exists(request);
    tokio::pin!(call);
    let same_image = same_image_as(&args.image);
    let mut view = View { image: args.image.clone(), ..Default::default() };
    let mut screen = Screen::new(style);
    let started = tokio::time::Instant::now();
    // Nothing drawn for a pull answered within a tick (an image already present).
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    let mut events_open = true;
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            event = events.message(), if events_open => match event {
                Ok(Some(event)) => {
                    if style.json() {
                        print_json(&super::events::json_of(&event))?;
                    }
                    if let Some(progress) = event.progress.filter(|_| same_image(&event.image)) {
                        view.progress = Some(progress);
                        view.waiting.clear();
                        screen.show(&view, started.elapsed())?;
                    }
                }
                // The daemon stopping ends the watch; the call says how.
                _ => events_open = false,
            },
            _ = tick.tick() => {
                if view.progress.is_none()
                    && let Ok(status) = daemon.status(api::GetStatusRequest::default()).await
                {
                    view.waiting = waiting(&status, &same_image);
                }
                screen.show(&view, started.elapsed())?;
            }
        }
    };
    screen.clear()?;
    match answer {
        Ok(answer) => done(&args.image, &answer.into_inner(), &style),
        Err(status) => {
            let error = daemon.error(&status, "EnsureImageExists").await;
            let uid = args.pod_uid.as_deref().unwrap_or_default();
            Err(error.with_backoff_clear(uid, &args.image, &args.runtime_handler))
        }
    }
}

/// The request as the kubelet would make it for a pod's container.
fn request(args: &PullArgs) -> Result<api::EnsureImageExistsRequest, CliError> {
    let (namespace, name) = match &args.pod {
        Some(pod) => pod
            .split_once('/')
            .filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty() && !name.contains('/'))
            .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
            .ok_or_else(|| CliError::Usage(format!("--pod {pod}: expected NAMESPACE/NAME")))?,
        None => (String::new(), String::new()),
    };
    let pull_secrets = args.secret.iter().map(|path| secret::read(path)).collect::<Result<_, _>>()?;
    Ok(api::EnsureImageExistsRequest {
        image: args.image.clone(),
        pull_policy: match args.policy {
            None => api::PullPolicy::Unspecified,
            Some(PolicyArg::Always) => api::PullPolicy::Always,
            Some(PolicyArg::IfNotPresent) => api::PullPolicy::IfNotPresent,
            Some(PolicyArg::Never) => api::PullPolicy::Never,
        } as i32,
        pod: Some(api::PodRef { namespace, name, uid: args.pod_uid.clone().unwrap_or_default(), ..Default::default() }),
        container_name: "cri-imaged-pull".to_owned(),
        pull_secrets,
        runtime_handler: args.runtime_handler.clone(),
        ..Default::default()
    })
}

/// Whether an image named in an answer is `image`, however either is spelled (`busybox`,
/// `docker.io/library/busybox:latest`).
fn same_image_as(image: &str) -> impl Fn(&str) -> bool + use<> {
    let wanted = reference::normalized(image);
    let image = image.to_owned();
    move |other: &str| other == image || (wanted.is_some() && reference::normalized(other) == wanted)
}

/// What the pull waits for, from the daemon's status (`PullInFlight.state`; an older daemon sends
/// none, and then only a pull without a slot is known to wait).
fn waiting(status: &api::GetStatusResponse, same_image: &impl Fn(&str) -> bool) -> String {
    let Some(pull) = status.pulls.iter().find(|pull| same_image(&pull.image)) else {
        return "asking the daemon".to_owned();
    };
    match pull.state.as_str() {
        "slot" => format!("waiting for a pull slot ({} queued)", status.pulls_queued),
        "" if pull.started.is_none() => format!("waiting for a pull slot ({} queued)", status.pulls_queued),
        "rate-limit" => format!("waiting for the registry's rate limit ({} mode)", status.rate_limit_mode),
        "registry" => "waiting: its registry has not answered a pull yet".to_owned(),
        _ => "resolving the manifest".to_owned(),
    }
}

/// The outcome on stdout (a pulled image's time and size), or as JSON.
fn done(image: &str, answer: &api::EnsureImageExistsResponse, style: &Style) -> Result<(), CliError> {
    if style.json() { print_json(&outcome_json(image, answer)) } else { print_lines([outcome(image, answer)], style) }
}

/// `Pulled IMAGE in 12s, 25.2 MB (image cc20811826ac)`, in bold.
fn outcome(image: &str, answer: &api::EnsureImageExistsResponse) -> Line {
    let id = short_id(&answer.image_ref);
    Line::strong(if answer.pulled {
        let took = wire_duration(answer.pull_duration.as_ref()).max(Duration::from_millis(1));
        format!("Pulled {image} in {}, {} (image {id})", duration(took), bytes(answer.image_size_bytes))
    } else {
        format!("{image} is already present (image {id})")
    })
}

fn outcome_json(image: &str, answer: &api::EnsureImageExistsResponse) -> Value {
    json!({
        "image": image,
        "imageRef": answer.image_ref,
        "pulled": answer.pulled,
        "message": answer.message,
        "pullSeconds": wire_duration(answer.pull_duration.as_ref()).as_secs_f64(),
        "imageSizeBytes": answer.image_size_bytes,
    })
}

/// The frame on a terminal, drawn again in place; a line every few seconds otherwise (a pipe,
/// or `NO_COLOR`: no escape at all).
struct Screen {
    style: Style,
    /// Lines of the frame on screen now.
    drawn: usize,
    last_plain: Option<(tokio::time::Instant, String)>,
}

impl Screen {
    fn new(style: Style) -> Self {
        Self { style, drawn: 0, last_plain: None }
    }

    fn show(&mut self, view: &View, elapsed: Duration) -> Result<(), CliError> {
        if self.style.json() {
            return Ok(());
        }
        if !self.style.color {
            let line = plain_line(view);
            let due = self.last_plain.as_ref().is_none_or(|(at, last)| *last != line && at.elapsed() >= PLAIN_EVERY);
            if due {
                self.last_plain = Some((tokio::time::Instant::now(), line.clone()));
                return print_lines([Line::plain(line)], &self.style);
            }
            return Ok(());
        }
        let (columns, rows) = crossterm::terminal::size().unwrap_or(self.style.size);
        let lines = frame(view, elapsed, columns, rows);
        let mut out = String::new();
        if self.drawn == 0 {
            out.push_str("\x1b[?25l");
        } else {
            out.push_str(&format!("\x1b[{}F", self.drawn));
        }
        // Line by line, never the whole screen at once: tmux (and others) keep a screen erased
        // whole in their history, which would fill with old frames.
        for line in &lines {
            out.push_str("\x1b[2K");
            out.push_str(&printable(line));
            out.push('\n');
        }
        if lines.len() < self.drawn {
            out.push_str("\x1b[J");
        }
        self.drawn = lines.len();
        write_terminal(&out)
    }

    /// Takes the frame off the screen, for the outcome's line.
    fn clear(&mut self) -> Result<(), CliError> {
        if self.drawn == 0 {
            return Ok(());
        }
        let erase = "\x1b[2K\x1b[1E".repeat(self.drawn);
        let out = format!("\x1b[{drawn}F{erase}\x1b[{drawn}F\x1b[?25h", drawn = self.drawn);
        self.drawn = 0;
        write_terminal(&out)
    }
}

impl Drop for Screen {
    /// Ctrl-C or an error mid-pull: the cursor comes back, the last frame stays.
    fn drop(&mut self) {
        if self.drawn > 0 {
            let _ = write_terminal("\x1b[?25h");
        }
    }
}

fn write_terminal(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).map_err(CliError::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(pull: api::PullInFlight) -> api::GetStatusResponse {
        api::GetStatusResponse {
            pulls: vec![pull],
            pulls_queued: 2,
            rate_limit_mode: "wait".to_owned(),
            ..Default::default()
        }
    }

    fn pull_in(state: &str) -> api::PullInFlight {
        api::PullInFlight {
            image: "docker.io/library/busybox:latest".to_owned(),
            state: state.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn a_pull_that_moves_no_bytes_says_what_it_waits_for_however_the_image_was_spelled() {
        let same = same_image_as("busybox");
        assert_eq!(waiting(&status_of(pull_in("slot")), &same), "waiting for a pull slot (2 queued)");
        assert_eq!(
            waiting(&status_of(pull_in("rate-limit")), &same),
            "waiting for the registry's rate limit (wait mode)"
        );
        assert_eq!(
            waiting(&status_of(pull_in("registry")), &same),
            "waiting: its registry has not answered a pull yet"
        );
        assert_eq!(waiting(&status_of(pull_in("pulling")), &same), "resolving the manifest");
        // An older daemon says no state: a pull without a slot still waits for one.
        assert_eq!(waiting(&status_of(pull_in("")), &same), "waiting for a pull slot (2 queued)");
        assert_eq!(waiting(&status_of(pull_in("slot")), &same_image_as("nginx")), "asking the daemon");
    }

    #[test]
    fn the_daemons_text_in_the_outcome_is_shown_never_acted_on_in_every_mode() {
        use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};
        for pulled in [true, false] {
            let answer = api::EnsureImageExistsResponse {
                image_ref: hostile("ref"),
                message: hostile("message"),
                pulled,
                ..Default::default()
            };
            for style in every_style() {
                if style.json() {
                    let line = crate::cli::render::json::line(&outcome_json(&hostile("image"), &answer)).expect("JSON");
                    let value = assert_json_line(&line);
                    assert_eq!(
                        (&value["image"], &value["imageRef"]),
                        (&json!(hostile("image")), &json!(hostile("ref")))
                    );
                    assert_eq!(value["message"], hostile("message"));
                    continue;
                }
                let text = rendered(&[outcome(&hostile("image"), &answer)], &style);
                let id = printable(short_id(&answer.image_ref));
                assert!(text.contains(&shown("image")) && text.contains(&id), "{text}");
                assert_eq!(text.starts_with("\x1b[1m"), style.color, "bold only with colour: {text:?}");
            }
        }
    }
}
