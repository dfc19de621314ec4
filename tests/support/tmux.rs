//! A terminal as a person has one: a private tmux server (its own socket) with one window of a
//! fixed size running a command, read back as the screen shows it.

use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use super::process::require_tool;

/// A tmux server of our own, killed on drop.
pub struct Terminal {
    server: String,
    tmux: PathBuf,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Terminal {
    /// Runs `command` (a shell line) in a `columns`×`rows` terminal with `env` set; the pane
    /// stays after the command exits so that its status and last screen can be read. `None`
    /// (after saying why) where tmux is missing outside CI; in CI a missing tmux fails.
    pub fn start(command: &str, columns: u16, rows: u16, env: &[(&str, &str)]) -> Option<Self> {
        let tmux = require_tool("tmux")?;
        let server = format!("cri-imaged-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let terminal = Self { server, tmux };
        let size = [columns.to_string(), rows.to_string()];
        // Read as the server starts, before the command runs: the pane outlives the command
        // however fast it ends.
        let config = std::env::temp_dir().join(format!("{}.conf", terminal.server));
        std::fs::write(&config, "set -g remain-on-exit on\nset -g status off\n").expect("tmux config written");
        let config = config.to_str().expect("a UTF-8 temp dir").to_owned();
        let mut args = vec!["-f", &config, "new-session", "-d", "-x", &size[0], "-y", &size[1]];
        let pairs: Vec<String> = env.iter().map(|(key, value)| format!("{key}={value}")).collect();
        for pair in &pairs {
            args.extend(["-e", pair.as_str()]);
        }
        // No shell start-up files: the screen holds only what the command draws.
        // The status on the screen: tmux 3.3 at times leaves an exited command unreaped (a zombie,
        // `#{pane_dead_status}` empty), so the shell that ran it tells it instead; bash, which goes
        // on after a command that handled Ctrl-C itself.
        let line = format!("{command}; printf '\\n[exited %d]\\n' $?");
        args.extend(["-s", "main", "bash", "-c", &line]);
        terminal.tmux(&args);
        Some(terminal)
    }

    fn tmux(&self, args: &[&str]) -> String {
        let output = Command::new(&self.tmux).arg("-L").arg(&self.server).args(args).output().expect("tmux runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The screen now (history included), as text.
    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-S", "-", "-t", "main"])
    }

    /// The screen with its SGR escapes (colours, bold) kept.
    pub fn screen_with_escapes(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-e", "-S", "-", "-t", "main"])
    }

    /// Waits (up to `limit`) until the screen satisfies `condition`; the screen then, or a
    /// panic with the last screen.
    pub fn wait_for(&self, what: &str, limit: Duration, condition: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let screen = self.screen();
            if condition(&screen) {
                return screen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the screen never showed {what} within {limit:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types `keys` (tmux key names: "q", "Enter", "C-c", or literal text).
    pub fn send_keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "main"];
        args.extend(keys);
        self.tmux(&args);
    }

    /// The command's exit status once it ended, waiting up to `limit`.
    pub fn exit_status(&self, limit: Duration) -> i32 {
        let screen = self.wait_for("the command's end", limit, |screen| screen.contains("[exited "));
        let status = screen.rsplit("[exited ").next().and_then(|rest| rest.split(']').next()?.parse().ok());
        status.unwrap_or_else(|| panic!("no exit status on the screen:\n{screen}"))
    }

    /// Whether the program shows the alternate screen (a full-screen view) now.
    pub fn alternate_screen(&self) -> bool {
        self.tmux(&["display-message", "-p", "-t", "main", "#{alternate_on}"]).trim() == "1"
    }

    /// Whether the cursor is shown now (a full-screen view hides it while it draws). A dead pane
    /// always says hidden: to see what a command left, run it with a shell that stays after it.
    pub fn cursor_visible(&self) -> bool {
        self.tmux(&["display-message", "-p", "-t", "main", "#{cursor_flag}"]).trim() == "1"
    }

    pub fn resize(&self, columns: u16, rows: u16) {
        self.tmux(&["resize-window", "-t", "main", "-x", &columns.to_string(), "-y", &rows.to_string()]);
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let socket = self.tmux(&["display-message", "-p", "#{socket_path}"]);
        self.tmux(&["kill-server"]);
        // tmux leaves its socket behind.
        let _ = std::fs::remove_file(socket.trim());
        let _ = std::fs::remove_file(std::env::temp_dir().join(format!("{}.conf", self.server)));
    }
}
