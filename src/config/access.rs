//! `--role ROLE=SUBJECT` and `--default-role`: who holds which role on the socket, the names in
//! the grants looked up once at start in `/etc/passwd` and `/etc/group`.

use std::{fmt, path::Path};

use super::{ConfigError, ServeArgs, ValueError};
use crate::access::{Grant, Policy, Role, Subject};

/// Whom a `--role` names, as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectArg {
    Uid(u32),
    User(String),
    Gid(u32),
    Group(String),
}

impl fmt::Display for SubjectArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uid(uid) => write!(f, "uid:{uid}"),
            Self::User(name) => write!(f, "user:{name}"),
            Self::Gid(gid) => write!(f, "gid:{gid}"),
            Self::Group(name) => write!(f, "group:{name}"),
        }
    }
}

/// One `--role`, as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleArg {
    pub role: Role,
    pub subject: SubjectArg,
}

/// `--default-role`: a role, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultRoleArg {
    /// Status, lists, events.
    Read,
    /// Read, and pulls and one's own pre-pulls.
    Pull,
    /// Everything.
    Admin,
    /// Nothing but health and reflection.
    None,
}

impl From<DefaultRoleArg> for Option<Role> {
    fn from(arg: DefaultRoleArg) -> Self {
        match arg {
            DefaultRoleArg::Read => Some(Role::Read),
            DefaultRoleArg::Pull => Some(Role::Pull),
            DefaultRoleArg::Admin => Some(Role::Admin),
            DefaultRoleArg::None => None,
        }
    }
}

/// `ROLE=SUBJECT`: `admin=group:cri-admins`, `read=uid:1000`.
pub fn parse_role(text: &str) -> Result<RoleArg, ValueError> {
    let bad = || ValueError::NotARole;
    let (role, subject) = text.split_once('=').ok_or_else(bad)?;
    let role = Role::parse(role).ok_or_else(bad)?;
    let (kind, id) = subject.split_once(':').ok_or_else(bad)?;
    let number = || id.parse::<u32>().map_err(|_| bad());
    let name = || if id.is_empty() { Err(bad()) } else { Ok(id.to_owned()) };
    let subject = match kind {
        "uid" => SubjectArg::Uid(number()?),
        "user" => SubjectArg::User(name()?),
        "gid" => SubjectArg::Gid(number()?),
        "group" => SubjectArg::Group(name()?),
        _ => return Err(bad()),
    };
    Ok(RoleArg { role, subject })
}

/// The id of `name` in a passwd- or group-style `text` (the third field).
fn id_in(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

impl ServeArgs {
    /// Who holds which role: root and `--reserved-connection-uid` admin, each `--role` with its
    /// names looked up in `/etc/passwd` and `/etc/group`, and `--default-role`.
    pub fn access_policy(&self) -> Result<Policy, ConfigError> {
        self.access_policy_from(Path::new("/etc/passwd"), Path::new("/etc/group"))
    }

    /// As [`Self::access_policy`], names looked up in `passwd` and `group`.
    pub fn access_policy_from(&self, passwd: &Path, group: &Path) -> Result<Policy, ConfigError> {
        let read = |path: &Path| {
            let bytes = crate::files::read_named(path, 1 << 20)
                .map_err(|error| ConfigError::Names { file: path.to_owned(), reason: error.to_string() })?;
            String::from_utf8(bytes)
                .map_err(|_| ConfigError::Names { file: path.to_owned(), reason: "not UTF-8 text".to_owned() })
        };
        let mut grants = Vec::with_capacity(self.role.len());
        for arg in &self.role {
            let unknown = |file: &Path| ConfigError::UnknownName {
                role: arg.role,
                subject: arg.subject.to_string(),
                file: file.to_owned(),
            };
            let subject = match &arg.subject {
                SubjectArg::Uid(uid) => Subject::Uid(*uid),
                SubjectArg::Gid(gid) => Subject::Gid(*gid),
                SubjectArg::User(name) => Subject::Uid(id_in(&read(passwd)?, name).ok_or_else(|| unknown(passwd))?),
                SubjectArg::Group(name) => Subject::Gid(id_in(&read(group)?, name).ok_or_else(|| unknown(group))?),
            };
            grants.push(Grant { role: arg.role, subject });
        }
        Ok(Policy::new(self.reserved_connection_uid, grants, self.default_role.into()))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::access::Caller;

    fn serve_args(flags: &[&str]) -> ServeArgs {
        let cli = crate::config::Cli::try_parse_from(["cri-imaged", "serve"].iter().chain(flags)).expect("parses");
        match cli.command {
            crate::config::Command::Serve(args) => args,
            _ => unreachable!("serve was asked for"),
        }
    }

    #[test]
    fn a_role_names_a_uid_a_user_a_gid_or_a_group() {
        assert_eq!(parse_role("admin=uid:1000"), Ok(RoleArg { role: Role::Admin, subject: SubjectArg::Uid(1000) }));
        assert_eq!(
            parse_role("read=group:monitoring").map(|arg| arg.subject.to_string()),
            Ok("group:monitoring".into())
        );
        for bad in ["admin", "root=uid:0", "admin=uid:x", "admin=group:", "admin=team:a", "pull=1000"] {
            assert_eq!(parse_role(bad), Err(ValueError::NotARole), "{bad}");
        }
    }

    #[test]
    fn names_are_looked_up_at_start_and_an_unknown_one_refuses_it() {
        let dir = tempfile::tempdir().expect("a directory");
        let (passwd, group) = (dir.path().join("passwd"), dir.path().join("group"));
        std::fs::write(&passwd, "root:x:0:0::/root:/bin/sh\nagent:x:1500:1500::/:/bin/false\n").expect("passwd");
        std::fs::write(&group, "root:x:0:\ncri-imaged:x:997:agent\n").expect("group");
        let args =
            serve_args(&["--role", "admin=group:cri-imaged", "--role", "read=user:agent", "--default-role", "none"]);
        let policy = args.access_policy_from(&passwd, &group).expect("every name is known");
        let member = Caller { uid: 1600, gid: 1600, pid: None, groups: vec![997] };
        assert_eq!(policy.role_of(Some(&member)), Some(Role::Admin));
        let agent = Caller { uid: 1500, gid: 1500, pid: None, groups: vec![] };
        assert_eq!(policy.role_of(Some(&agent)), Some(Role::Read));
        assert_eq!(policy.role_of(Some(&Caller { uid: 1700, ..agent })), None, "--default-role none");
        let unknown = serve_args(&["--role", "admin=group:nope"]).access_policy_from(&passwd, &group);
        assert_eq!(
            unknown.expect_err("no such group").to_string(),
            format!("invalid configuration: --role admin=group:nope: no such name in {}", group.display())
        );
    }

    #[test]
    fn by_default_callers_pull_and_the_kubelets_uid_is_admin() {
        let policy = serve_args(&["--reserved-connection-uid", "995"]).access_policy().expect("no names to look up");
        let caller = |uid| Caller { uid, gid: uid, pid: None, groups: vec![] };
        assert_eq!(policy.role_of(Some(&caller(995))), Some(Role::Admin));
        assert_eq!(policy.role_of(Some(&caller(1000))), Some(Role::Pull));
    }
}
