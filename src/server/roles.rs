//! Roles at the door: each request's method looked up in the one table
//! ([`crate::access::table`]), the caller's role from its connection, and a refusal answered
//! PERMISSION_DENIED before any service reads the request. GarbageCollect and CancelPrePull, whose
//! need depends on what they are asked, are let in with the least they need and decided again by
//! their handlers ([`decide_in_handler`]). Every call of the table is counted by method, role and
//! result; every state-changing call is logged with its caller, and so is a caller's first refusal
//! of a method in an interval, the rest summarised ([`refusals`]).

mod refusals;

use std::{
    convert::Infallible,
    future::{Ready, ready},
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};

use futures_util::future::Either;
use tonic::body::Body;
use tower::{Layer, Service};

use self::refusals::{CallerKey, RefusalLog, Summary, Verdict};
use super::{metrics::CallMetrics, peer::ConnectedPeer};
use crate::{
    access::{
        self, Caller, Denied, Method, Need, Policy, Role,
        table::{self, Audit},
    },
    shutdown::Shutdown,
};

/// What the door found, in each admitted request's extensions.
#[derive(Debug, Clone)]
pub struct Granted {
    pub caller: Option<Caller>,
    pub role: Option<Role>,
}

/// The layer; one policy for the daemon's life (`--role`, `--default-role` change at a restart).
#[derive(Debug, Clone)]
pub struct RolesLayer {
    policy: Arc<Policy>,
    calls: Arc<Recorder>,
}

impl RolesLayer {
    pub fn new(policy: Arc<Policy>, calls: Arc<Recorder>) -> Self {
        Self { policy, calls }
    }
}

/// Counts and logs the calls of the table, the door's and the handlers' alike; one for the server.
#[derive(Debug)]
pub struct Recorder {
    metrics: Arc<CallMetrics>,
    refusals: Mutex<RefusalLog>,
}

impl Recorder {
    pub fn new(metrics: Arc<CallMetrics>) -> Self {
        Self { metrics, refusals: Mutex::new(RefusalLog::new(tokio::time::Instant::now())) }
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, RefusalLog> {
        // A panic elsewhere leaves the counts usable: they are only counts.
        self.refusals.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How often the summary task looks whether the interval is over. An interval may also be closed
/// by the next refusal, so the task's ticks drift from it: a summary is due at most this late.
const SUMMARY_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Logs the summary of refusals counted, not logged, once per interval, so that it appears even
/// when the refusals stop; at shutdown, what the last interval counted.
pub async fn summarise_refusals(calls: Arc<Recorder>, shutdown: Shutdown) {
    let mut ticker = tokio::time::interval(SUMMARY_CHECK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stopping = shutdown.requested();
    tokio::pin!(stopping);
    loop {
        let now = tokio::select! {
            now = ticker.tick() => now,
            () = &mut stopping => break,
        };
        // Taken first: the lock is not held while logging.
        let summaries = calls.refusals().close_due(now);
        log_summaries(summaries);
    }
    let summaries = calls.refusals().close(tokio::time::Instant::now());
    log_summaries(summaries);
}

fn log_summaries(summaries: Vec<Summary>) {
    for summary in summaries {
        let (suppressed, methods) = (summary.suppressed, summary.methods_named());
        match summary.caller {
            Some(CallerKey { uid, gid, pid }) => {
                tracing::info!(uid, gid, pid, suppressed, methods, "refused calls aggregated");
            }
            None => {
                let callers = "untracked";
                tracing::info!(callers, suppressed, methods, "refused calls aggregated");
            }
        }
    }
}

impl<S> Layer<S> for RolesLayer {
    type Service = Roles<S>;

    fn layer(&self, inner: S) -> Roles<S> {
        Roles { inner, policy: self.policy.clone(), calls: self.calls.clone() }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub struct Roles<S> {
    inner: S,
    policy: Arc<Policy>,
    calls: Arc<Recorder>,
}

type Refusal = Ready<Result<http::Response<Body>, Infallible>>;

impl<S, B> Service<http::Request<B>> for Roles<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, Refusal>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let Some(method) = table::method_at(request.uri().path()) else {
            return Either::Left(self.inner.call(request));
        };
        let caller = request.extensions().get::<ConnectedPeer>().and_then(ConnectedPeer::caller);
        let role = self.policy.role_of(caller.as_ref());
        let decided = access::allow(method.name, method.need.at_the_door(), caller.as_ref(), role)
            .map_err(|denied| Denied { needed: method.need.least(), ..denied });
        // One whose need depends on the request is recorded by its handler, once it knows.
        if decided.is_err() || matches!(method.need, Need::Role(_)) {
            record(&self.calls, &method, caller.as_ref(), role, &decided);
        }
        match decided {
            Ok(()) => {
                request.extensions_mut().insert(Granted { caller, role });
                Either::Left(self.inner.call(request))
            }
            Err(denied) => Either::Right(ready(Ok(tonic::Status::from(denied).into_http()))),
        }
    }
}

/// For a method whose need depends on what it is asked (`path`'s, needing `needed` for this
/// request): decides with what the door found, records the call, and says why if refused.
pub fn decide_in_handler<T>(
    request: &tonic::Request<T>,
    path: &str,
    needed: Role,
    calls: &Recorder,
) -> Result<(), Denied> {
    let granted = request.extensions().get::<Granted>();
    let (caller, role) = granted.map_or((None, None), |granted| (granted.caller.as_ref(), granted.role));
    let Some(method) = table::method_at(path) else {
        return Ok(());
    };
    let decided = access::allow(method.name, needed, caller, role);
    record(calls, &method, caller, role, &decided);
    decided
}

/// Counts the call; logs it when it changes state, or when refused and not only counted toward a
/// summary.
fn record(
    calls: &Recorder,
    method: &Method,
    caller: Option<&Caller>,
    role: Option<Role>,
    decided: &Result<(), Denied>,
) {
    let allowed = decided.is_ok();
    calls.metrics.count(method.label, access::label(role), allowed);
    let (uid, gid, pid) = (caller.map(|c| c.uid), caller.map(|c| c.gid), caller.and_then(|c| c.pid));
    let role = access::label(role);
    match decided {
        Ok(()) => match method.audit {
            Audit::Read => {}
            Audit::Pull => tracing::debug!(method = method.name, uid, gid, pid, role, allowed, "call allowed"),
            Audit::Change => tracing::info!(method = method.name, uid, gid, pid, role, allowed, "call allowed"),
        },
        Err(denied) => {
            let key = CallerKey { uid, gid, pid };
            let decision = calls.refusals().refused(key, method.name, tokio::time::Instant::now());
            log_summaries(decision.closed);
            if decision.verdict == Verdict::Log {
                let needed = denied.needed.as_str();
                tracing::info!(method = method.name, uid, gid, pid, role, needed, allowed, "call refused");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;

    /// Answers every request it is given OK, as a route would.
    fn routes() -> impl Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone {
        tower::service_fn(|_: http::Request<Body>| async { Ok(http::Response::new(Body::empty())) })
    }

    async fn grpc_status(path: &str, calls: &Arc<Recorder>) -> Option<String> {
        let layer = RolesLayer::new(Arc::new(Policy::default()), calls.clone());
        let request = http::Request::builder().uri(path).body(Body::empty()).expect("a request");
        let response = layer.layer(routes()).oneshot(request).await.expect("infallible");
        response.headers().get("grpc-status").map(|code| code.to_str().expect("ASCII").to_owned())
    }

    #[tokio::test]
    async fn a_caller_the_kernel_did_not_name_reaches_health_but_no_method_of_the_table() {
        let calls = Arc::new(Recorder::new(Arc::default()));
        assert_eq!(grpc_status("/grpc.health.v1.Health/Check", &calls).await, None, "passed on to the route");
        let denied = Some((tonic::Code::PermissionDenied as i32).to_string());
        for (path, _) in table::known() {
            assert_eq!(grpc_status(&path, &calls).await, denied, "{path}");
        }
        assert_eq!(grpc_status("/runtime.v1.ImageService/Unknown", &calls).await, denied);
    }

    /// What is logged in this thread while the guard lives.
    fn captured() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
        #[derive(Clone)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("not poisoned").extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let logs = Arc::new(Mutex::new(Vec::new()));
        let buffer = Buffer(logs.clone());
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || buffer.clone()).finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn lines_with(logs: &Mutex<Vec<u8>>, what: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&logs.lock().expect("not poisoned")).into_owned();
        text.lines().filter(|line| line.contains(what)).map(str::to_owned).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_after_the_first_are_summarised_once_the_interval_is_over_even_when_they_stop() {
        let (logs, _guard) = captured();
        let calls = Arc::new(Recorder::new(Arc::default()));
        let (stop, shutdown) = crate::shutdown::channel();
        let summaries = tokio::spawn(summarise_refusals(calls.clone(), shutdown));
        for _ in 0..100 {
            grpc_status("/imagemanager.v1.ImageManager/ClearBackoff", &calls).await;
        }
        assert_eq!(lines_with(&logs, "call refused").len(), 1, "only the first is logged");
        assert_eq!(lines_with(&logs, "aggregated"), Vec::<String>::new(), "the interval is not over");

        tokio::time::sleep(refusals::INTERVAL + SUMMARY_CHECK).await;
        let summary = lines_with(&logs, "refused calls aggregated");
        assert_eq!(summary.len(), 1, "{summary:?}");
        assert!(summary[0].contains("suppressed=99") && summary[0].contains("methods=\"ClearBackoff\""), "{summary:?}");

        // What the last interval counted is said at shutdown, not lost.
        grpc_status("/imagemanager.v1.ImageManager/ClearBackoff", &calls).await;
        grpc_status("/imagemanager.v1.ImageManager/ClearBackoff", &calls).await;
        stop.request();
        summaries.await.expect("the task ends on shutdown");
        let summaries = lines_with(&logs, "refused calls aggregated");
        assert_eq!(summaries.len(), 2, "{summaries:?}");
        assert!(summaries[1].contains("suppressed=1"), "{summaries:?}");
        assert_eq!(lines_with(&logs, "call refused").len(), 2, "a new interval's first is logged");
    }
}
