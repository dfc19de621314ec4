use super::*;
use crate::access::table::{self, Need, cancel_needs, gc_needs, method_at};

fn caller(uid: u32, gid: u32, groups: &[u32]) -> Caller {
    Caller { uid, gid, pid: Some(4242), groups: groups.to_vec() }
}

fn grant(role: Role, subject: Subject) -> Grant {
    Grant { role, subject }
}

/// What each method needs, read off the table by path, with the request's body where it counts.
fn needed(path: &str) -> Option<Need> {
    method_at(path).map(|method| method.need)
}

#[test]
fn every_method_needs_the_role_the_table_gives_it() {
    let ours = |name: &str| needed(&format!("/imagemanager.v1.ImageManager/{name}"));
    let cri = |name: &str| needed(&format!("/runtime.v1.ImageService/{name}"));
    for name in ["GetStatus", "WatchEvents", "ListImages", "ListEvents", "ListBackoffs", "ListPrePulls", "GetPrePull"] {
        assert_eq!(ours(name), Some(Need::Role(Role::Read)), "{name}");
    }
    assert_eq!(ours("EnsureImageExists"), Some(Need::Role(Role::Pull)));
    assert_eq!(ours("SubmitPrePull"), Some(Need::Role(Role::Pull)));
    // It reads registries with the node's credentials, as a pull does.
    assert_eq!(ours("CheckImagePolicy"), Some(Need::Role(Role::Pull)));
    assert_eq!(ours("ClearBackoff"), Some(Need::Role(Role::Admin)));
    assert_eq!(ours("CancelPrePull"), Some(Need::Cancel));
    assert_eq!(ours("GarbageCollect"), Some(Need::GcPass));
    for name in ["ImageStatus", "ListImages", "ImageFsInfo"] {
        assert_eq!(cri(name), Some(Need::Role(Role::Read)), "CRI {name}");
    }
    assert_eq!(cri("PullImage"), Some(Need::Role(Role::Pull)));
    assert_eq!(cri("RemoveImage"), Some(Need::Role(Role::Admin)));
    // Kubernetes 1.38's, relayed: as their like.
    assert_eq!(cri("StreamImages"), Some(Need::Role(Role::Read)));
    assert_eq!(cri("ListSecurityProfiles"), Some(Need::Role(Role::Read)));
    assert_eq!(cri("PullSecurityProfile"), Some(Need::Role(Role::Pull)));
    assert_eq!(cri("RemoveSecurityProfile"), Some(Need::Role(Role::Admin)));
    assert_eq!(cri("SomethingNew"), Some(Need::Role(Role::Admin)), "an unknown CRI method");
    assert_eq!(method_at("/runtime.v1.ImageService/SomethingNew").map(|method| method.label), Some("cri_other"));
    for anyone in [
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/imagemanager.v1.ImageManager/NotAMethod",
        "/other.Service/Call",
    ] {
        assert_eq!(needed(anyone), None, "{anyone}");
    }
    assert_eq!(table::known().count(), 22, "every method of both services is in the table");
}

#[test]
fn a_dry_run_gc_needs_read_and_one_that_removes_admin() {
    assert_eq!((gc_needs(true), gc_needs(false)), (Role::Read, Role::Admin));
    assert_eq!(Need::GcPass.at_the_door(), Role::Read);
}

#[test]
fn cancelling_ones_own_pre_pull_needs_pull_and_anyone_elses_admin() {
    assert_eq!(cancel_needs(Some(Some(1000)), Some(1000)), Role::Pull);
    assert_eq!(cancel_needs(Some(Some(1000)), Some(1001)), Role::Admin);
    assert_eq!(cancel_needs(Some(None), Some(1000)), Role::Admin, "submitted before owners were kept");
    assert_eq!(cancel_needs(Some(Some(1000)), None), Role::Admin, "a caller the kernel did not name");
    assert_eq!(cancel_needs(None, Some(1000)), Role::Pull, "no such pre-pull: what any cancel needs");
    assert_eq!(Need::Cancel.at_the_door(), Role::Read, "decided in the handler, which knows the owner");
    assert_eq!(Need::Cancel.least(), Role::Pull, "what a caller holding no role is told");
}

/// What a request needs, as the server decides it: the table's role, or for the two methods
/// whose need depends on the request, what the request makes it.
fn need_of(path: &str, dry_run: bool, own_pre_pull: bool) -> Role {
    match method_at(path).expect("in the table").need {
        Need::Role(role) => role,
        Need::GcPass => gc_needs(dry_run),
        Need::Cancel => cancel_needs(Some(Some(1000)), Some(if own_pre_pull { 1000 } else { 1001 })),
    }
}

#[test]
fn each_role_may_call_exactly_the_methods_at_or_below_it() {
    const OURS: &str = "/imagemanager.v1.ImageManager/";
    const CRI: &str = "/runtime.v1.ImageService/";
    // (method, a dry run, one's own pre-pull) and the lowest role that may call it.
    let lowest = [
        ((OURS, "GetStatus", false, false), Role::Read),
        ((OURS, "WatchEvents", false, false), Role::Read),
        ((OURS, "ListImages", false, false), Role::Read),
        ((OURS, "ListEvents", false, false), Role::Read),
        ((OURS, "ListBackoffs", false, false), Role::Read),
        ((OURS, "ListPrePulls", false, false), Role::Read),
        ((OURS, "GetPrePull", false, false), Role::Read),
        ((OURS, "GarbageCollect", true, false), Role::Read),
        ((OURS, "EnsureImageExists", false, false), Role::Pull),
        ((OURS, "SubmitPrePull", false, false), Role::Pull),
        ((OURS, "CancelPrePull", false, true), Role::Pull),
        ((OURS, "CancelPrePull", false, false), Role::Admin),
        ((OURS, "ClearBackoff", false, false), Role::Admin),
        ((OURS, "GarbageCollect", false, false), Role::Admin),
        ((CRI, "ImageStatus", false, false), Role::Read),
        ((CRI, "ListImages", false, false), Role::Read),
        ((CRI, "ImageFsInfo", false, false), Role::Read),
        ((CRI, "PullImage", false, false), Role::Pull),
        ((CRI, "RemoveImage", false, false), Role::Admin),
        ((CRI, "AnythingElse", false, false), Role::Admin),
    ];
    for ((service, name, dry_run, own), lowest) in lowest {
        let path = format!("{service}{name}");
        let needed = need_of(&path, dry_run, own);
        for held in [None, Some(Role::Read), Some(Role::Pull), Some(Role::Admin)] {
            let allowed = allow("m", needed, None, held).is_ok();
            assert_eq!(allowed, held >= Some(lowest), "{path} (dry run {dry_run}, own {own}) holding {held:?}");
        }
    }
}

#[test]
fn root_and_the_kubelets_uid_are_admin_whatever_the_default() {
    let policy = Policy::new(Some(995), Vec::new(), None);
    assert_eq!(policy.role_of(Some(&caller(0, 0, &[]))), Some(Role::Admin));
    assert_eq!(policy.role_of(Some(&caller(995, 995, &[]))), Some(Role::Admin));
    assert_eq!(policy.role_of(Some(&caller(1000, 1000, &[]))), None);
}

#[test]
fn grants_match_by_uid_primary_gid_and_supplementary_group() {
    let policy = Policy::new(
        None,
        vec![grant(Role::Admin, Subject::Uid(1000)), grant(Role::Pull, Subject::Gid(997))],
        Some(Role::Read),
    );
    assert_eq!(policy.role_of(Some(&caller(1000, 1000, &[]))), Some(Role::Admin), "by uid");
    assert_eq!(policy.role_of(Some(&caller(1001, 997, &[]))), Some(Role::Pull), "by primary group");
    assert_eq!(policy.role_of(Some(&caller(1002, 100, &[100, 997]))), Some(Role::Pull), "by supplementary group");
    assert_eq!(policy.role_of(Some(&caller(1003, 100, &[100]))), Some(Role::Read), "no match: the default");
}

#[test]
fn the_highest_role_among_a_callers_matches_wins_even_below_the_default() {
    let policy = Policy::new(
        None,
        vec![
            grant(Role::Read, Subject::Uid(1000)),
            grant(Role::Admin, Subject::Gid(10)),
            grant(Role::Pull, Subject::Gid(20)),
        ],
        Some(Role::Pull),
    );
    assert_eq!(policy.role_of(Some(&caller(1000, 20, &[10]))), Some(Role::Admin));
    assert_eq!(
        policy.role_of(Some(&caller(1000, 1000, &[]))),
        Some(Role::Read),
        "a grant, even a lower one than the default, says what the caller holds"
    );
}

#[test]
fn default_none_refuses_every_method_and_no_credentials_hold_no_role() {
    let policy = Policy::new(None, Vec::new(), None);
    let nobody = caller(65534, 65534, &[]);
    for (_, method) in table::known() {
        let held = policy.role_of(Some(&nobody));
        assert!(allow(method.name, method.need.at_the_door(), Some(&nobody), held).is_err(), "{}", method.name);
    }
    assert_eq!(Policy::default().role_of(None), None);
}

#[test]
fn a_refusal_names_the_method_the_role_it_needs_the_caller_and_what_it_holds() {
    let refused = allow("ClearBackoff", Role::Admin, Some(&caller(1000, 1000, &[1000, 997])), Some(Role::Pull))
        .expect_err("pull is not admin");
    assert_eq!(
        refused.to_string(),
        "ClearBackoff needs the admin role; uid 1000 (gid 1000, groups 997) has pull (--role and --default-role say who has which)"
    );
    let nobody = allow("GetStatus", Role::Read, None, None).expect_err("no role");
    assert_eq!(
        nobody.to_string(),
        "GetStatus needs the read role; a caller the kernel did not name has no role (--role and --default-role say who has which)"
    );
}
