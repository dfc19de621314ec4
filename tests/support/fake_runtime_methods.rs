//! Image service methods of the fake runtime's own, which cri-imaged has never heard of: one of
//! each shape, so that tests can see a call relayed whole, its metadata, deadline, messages and
//! status. Each message is raw bytes: no proto describes them.
//!
//! - `PullSecurityProfile` (unary, as Kubernetes 1.38 calls it): answers the request's bytes, with
//!   headers saying what metadata and `grpc-timeout` it saw;
//! - `FakeCount` (server streaming): asked `{n: N}` (field 1, a varint under 128), answers `{n: 0}`,
//!   `{n: 1}`... `{n: N-1}`;
//! - `FakeGather` (client streaming): the caller's messages joined;
//! - `FakeChat` (both ways): each message back, reversed;
//! - `FakeRefuse` (unary): FAILED_PRECONDITION with details and metadata of its own.

use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use cri_imaged::runtime::passthrough::RawCodec;
use futures_util::StreamExt;
use tonic::{Request, Response, Status, Streaming, body::Body, metadata::MetadataValue, server::NamedService};

/// The request metadata `PullSecurityProfile` tells back (as `x-fake-saw-metadata`).
pub const CALLER_METADATA: &str = "x-caller-metadata";

/// The fake's image service with the methods above beside the CRI's.
#[derive(Clone)]
pub struct WithMethodsOfItsOwn<S>(pub S);

impl<S> NamedService for WithMethodsOfItsOwn<S> {
    const NAME: &'static str = "runtime.v1.ImageService";
}

type Answer = http::Response<Body>;
type Messages = Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, Status>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for WithMethodsOfItsOwn<S>
where
    S: tower::Service<http::Request<Body>, Response = Answer, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut grpc = tonic::server::Grpc::new(RawCodec);
        match request.uri().path().strip_prefix("/runtime.v1.ImageService/") {
            Some("PullSecurityProfile") => {
                let pull = tower::service_fn(|call: Request<Bytes>| async move {
                    let saw =
                        |name: &str| call.metadata().get(name).cloned().unwrap_or(MetadataValue::from_static("-"));
                    let (metadata, timeout) = (saw(CALLER_METADATA), saw("grpc-timeout"));
                    let mut answer = Response::new(call.get_ref().clone());
                    answer.metadata_mut().insert("x-fake-saw-metadata", metadata);
                    answer.metadata_mut().insert("x-fake-saw-timeout", timeout);
                    Ok::<_, Status>(answer)
                });
                Box::pin(async move { Ok(grpc.unary(pull, request).await) })
            }
            Some("FakeCount") => {
                let count = tower::service_fn(|call: Request<Bytes>| async move {
                    let n = call.get_ref().get(1).copied().unwrap_or(0);
                    let messages: Messages =
                        Box::pin(futures_util::stream::iter((0..n).map(|i| Ok(Bytes::from(vec![0x08, i])))));
                    Ok::<_, Status>(Response::new(messages))
                });
                Box::pin(async move { Ok(grpc.server_streaming(count, request).await) })
            }
            Some("FakeGather") => {
                let gather = tower::service_fn(|call: Request<Streaming<Bytes>>| async move {
                    let mut messages = call.into_inner();
                    let mut joined = Vec::new();
                    while let Some(message) = messages.next().await {
                        joined.extend_from_slice(&message?);
                    }
                    Ok::<_, Status>(Response::new(Bytes::from(joined)))
                });
                Box::pin(async move { Ok(grpc.client_streaming(gather, request).await) })
            }
            Some("FakeChat") => {
                let chat = tower::service_fn(|call: Request<Streaming<Bytes>>| async move {
                    let replies: Messages = Box::pin(call.into_inner().map(|message| {
                        message.map(|message| message.iter().rev().copied().collect::<Vec<u8>>().into())
                    }));
                    Ok::<_, Status>(Response::new(replies))
                });
                Box::pin(async move { Ok(grpc.streaming(chat, request).await) })
            }
            Some("FakeRefuse") => {
                let mut refusal = Status::with_details(
                    tonic::Code::FailedPrecondition,
                    "refused by the fake",
                    Bytes::from_static(b"\x08\x09"),
                );
                refusal.metadata_mut().insert("x-fake-why", MetadataValue::from_static("it was asked to"));
                Box::pin(async move { Ok(refusal.into_http()) })
            }
            _ => {
                let mut inner = self.0.clone();
                Box::pin(async move { inner.call(request).await })
            }
        }
    }
}
