//! Roles at the door: each request's method looked up in the one table
//! ([`crate::access::table`]), the caller's role from its connection, and a refusal answered
//! PERMISSION_DENIED before any service reads the request. GarbageCollect and CancelPrePull, whose
//! need depends on what they are asked, are let in with the least they need and decided again by
//! their handlers ([`decide_in_handler`]). Every call of the table is counted by method, role and
//! result; every state-changing call, and every refusal, is logged with its caller.

use std::{
    convert::Infallible,
    future::{Ready, ready},
    sync::Arc,
    task::{Context, Poll},
};

use futures_util::future::Either;
use tonic::body::Body;
use tower::{Layer, Service};

use super::{metrics::CallMetrics, peer::ConnectedPeer};
use crate::access::{
    self, Caller, Denied, Method, Need, Policy, Role,
    table::{self, Audit},
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
    calls: Arc<CallMetrics>,
}

impl RolesLayer {
    pub fn new(policy: Arc<Policy>, calls: Arc<CallMetrics>) -> Self {
        Self { policy, calls }
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
    calls: Arc<CallMetrics>,
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
    calls: &CallMetrics,
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

/// Counts the call; logs it when it changes state or was refused.
fn record(
    calls: &CallMetrics,
    method: &Method,
    caller: Option<&Caller>,
    role: Option<Role>,
    decided: &Result<(), Denied>,
) {
    let allowed = decided.is_ok();
    calls.count(method.label, access::label(role), allowed);
    let (uid, gid, pid) = (caller.map(|c| c.uid), caller.map(|c| c.gid), caller.and_then(|c| c.pid));
    let role = access::label(role);
    match decided {
        Ok(()) => match method.audit {
            Audit::Read => {}
            Audit::Pull => tracing::debug!(method = method.name, uid, gid, pid, role, allowed, "call allowed"),
            Audit::Change => tracing::info!(method = method.name, uid, gid, pid, role, allowed, "call allowed"),
        },
        Err(denied) => {
            let needed = denied.needed.as_str();
            tracing::info!(method = method.name, uid, gid, pid, role, needed, allowed, "call refused");
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

    async fn grpc_status(path: &str, calls: &Arc<CallMetrics>) -> Option<String> {
        let layer = RolesLayer::new(Arc::new(Policy::default()), calls.clone());
        let request = http::Request::builder().uri(path).body(Body::empty()).expect("a request");
        let response = layer.layer(routes()).oneshot(request).await.expect("infallible");
        response.headers().get("grpc-status").map(|code| code.to_str().expect("ASCII").to_owned())
    }

    #[tokio::test]
    async fn a_caller_the_kernel_did_not_name_reaches_health_but_no_method_of_the_table() {
        let calls = Arc::new(CallMetrics::default());
        assert_eq!(grpc_status("/grpc.health.v1.Health/Check", &calls).await, None, "passed on to the route");
        let denied = Some((tonic::Code::PermissionDenied as i32).to_string());
        for (path, _) in table::known() {
            assert_eq!(grpc_status(&path, &calls).await, denied, "{path}");
        }
        assert_eq!(grpc_status("/runtime.v1.ImageService/Unknown", &calls).await, denied);
    }
}
