//! Accounts of the tests' own: a throwaway system group, for tests that call the daemon as an
//! unprivileged user in (or outside) a group.

use std::process::Command;

/// A system group of the test's own, its name unique to this run; deleted when dropped.
pub struct ThrowawayGroup {
    pub name: String,
    pub gid: u32,
}

impl ThrowawayGroup {
    pub fn create() -> Self {
        // At most 32 characters, as useradd's names.
        let name = format!("cri-imaged-t{}", std::process::id());
        let made = Command::new("groupadd").args(["--system", &name]).output().expect("groupadd runs");
        assert!(made.status.success(), "groupadd {name}: {}", String::from_utf8_lossy(&made.stderr));
        // Deleted from here on, whatever fails.
        let mut group = Self { gid: 0, name };
        let entry = Command::new("getent").args(["group", &group.name]).output().expect("getent runs");
        let entry = String::from_utf8_lossy(&entry.stdout).into_owned();
        group.gid = entry.split(':').nth(2).and_then(|gid| gid.parse().ok()).expect("the group's gid");
        group
    }

    /// Adds `user` to the group's members in /etc/group, as `usermod -aG` would.
    pub fn add(&self, user: &str) {
        let added = Command::new("gpasswd").args(["--add", user, &self.name]).output().expect("gpasswd runs");
        assert!(added.status.success(), "gpasswd --add: {}", String::from_utf8_lossy(&added.stderr));
    }
}

impl Drop for ThrowawayGroup {
    fn drop(&mut self) {
        let deleted = Command::new("groupdel").arg(&self.name).output();
        if !deleted.is_ok_and(|output| output.status.success()) {
            eprintln!("clean-up: groupdel {} failed; remove the group by hand", self.name);
        }
    }
}
