use super::*;

fn caller(pid: i32) -> CallerKey {
    CallerKey { uid: Some(65534), gid: Some(65534), pid: Some(pid) }
}

/// Refuses `caller` `method` `times` times at `now`; how many were logged.
fn refuse(log: &mut RefusalLog, caller: CallerKey, method: &'static str, times: usize, now: Instant) -> usize {
    (0..times).filter(|_| log.refused(caller, method, now).verdict == Verdict::Log).count()
}

#[test]
fn the_first_refusal_of_a_method_by_a_caller_is_logged_and_the_rest_only_counted() {
    let start = Instant::now();
    let mut log = RefusalLog::new(start);
    assert_eq!(refuse(&mut log, caller(1), "ClearBackoff", 20_000, start), 1);
    assert_eq!(refuse(&mut log, caller(1), "SubmitPrePull", 3, start), 1, "another method's first is logged");
    assert_eq!(refuse(&mut log, caller(2), "ClearBackoff", 3, start), 1, "another caller's first is logged");
    let in_namespace = CallerKey { pid: None, ..caller(1) };
    assert_eq!(refuse(&mut log, in_namespace, "ClearBackoff", 2, start), 1, "a pid-less caller is its uid and gid");
}

#[test]
fn once_the_interval_is_over_each_caller_with_counted_refusals_gets_one_summary_and_firsts_are_logged_again() {
    let start = Instant::now();
    let mut log = RefusalLog::new(start);
    refuse(&mut log, caller(1), "ClearBackoff", 1000, start);
    refuse(&mut log, caller(1), "GarbageCollect", 1, start);
    refuse(&mut log, caller(2), "ClearBackoff", 1, start);
    assert_eq!(log.close_due(start + INTERVAL - Duration::from_millis(1)), [], "not over yet");

    let later = start + INTERVAL;
    let decision = log.refused(caller(3), "ClearBackoff", later);
    let only_counted = Summary { caller: Some(caller(1)), suppressed: 999, methods: vec!["ClearBackoff"] };
    assert_eq!(decision.closed, [only_counted], "caller 2 had nothing counted, so no summary");
    assert_eq!(decision.verdict, Verdict::Log, "the new interval's first");
    assert_eq!(refuse(&mut log, caller(1), "ClearBackoff", 5, later), 1, "a new interval logs the first again");
    assert_eq!(log.close_due(later + INTERVAL).iter().map(|s| s.suppressed).collect::<Vec<_>>(), [4]);
    assert_eq!(log.close_due(later + INTERVAL * 3), [], "a quiet interval says nothing");
}

#[test]
fn callers_beyond_the_bound_are_counted_together_and_summarised_as_untracked() {
    let start = Instant::now();
    let mut log = RefusalLog::new(start);
    let pids = i32::try_from(MAX_CALLERS).expect("small");
    let logged: usize = (0..pids).map(|pid| refuse(&mut log, caller(pid), "ClearBackoff", 1, start)).sum();
    assert_eq!(logged, MAX_CALLERS);
    let beyond: usize = (pids..pids + 5000).map(|pid| refuse(&mut log, caller(pid), "ClearBackoff", 2, start)).sum();
    assert_eq!(beyond, 0, "a flood of new pids logs nothing more");
    assert_eq!(log.callers.len(), MAX_CALLERS, "nor is tracked");
    assert_eq!(refuse(&mut log, caller(0), "ClearBackoff", 2, start), 0, "one tracked is still counted as itself");

    let closed = log.close(start + Duration::from_secs(1));
    let untracked = Summary { caller: None, suppressed: 10_000, methods: vec!["ClearBackoff"] };
    assert_eq!(closed.last(), Some(&untracked));
    assert_eq!(closed.first().map(|s| (s.caller, s.suppressed)), Some((Some(caller(0)), 2)));
    assert_eq!(closed.len(), 2);
    assert!(log.callers.is_empty(), "closing forgets the interval's callers");
}

#[test]
fn a_summary_names_a_few_methods_then_how_many_more() {
    let start = Instant::now();
    let mut log = RefusalLog::new(start);
    let methods = ["A", "B", "C", "D", "E", "F"];
    for method in methods {
        refuse(&mut log, caller(1), method, 2, start);
    }
    let closed = log.close(start);
    assert_eq!(closed[0].suppressed, 6);
    assert_eq!(closed[0].methods_named(), "A, B, C, D and 2 more");
    let few = Summary { caller: None, suppressed: 1, methods: vec!["A", "B"] };
    assert_eq!(few.methods_named(), "A, B");
}
