//! containerd's image events, watched so that the presence cache never outlives a change.
//!
//! containerd sends a stream's headers only with its first event, so a subscription gives no sign
//! of being registered. We publish a marker event of our own until it comes back on the stream:
//! from then on every image event reaches us, and only then does the cache remember anything.
//! Runtimes without containerd's event service (CRI-O) answer UNIMPLEMENTED; the cache then stays
//! off and every presence check asks the runtime, as the kubelet does.

use std::{sync::Arc, time::Duration};

use tonic::transport::Channel;

use crate::presence::PresenceCache;

mod proto {
    tonic::include_proto!("containerd.services.events.v1");
}

use proto::{PublishRequest, SubscribeRequest, events_client::EventsClient};

/// The topic of our marker event.
const MARKER_TOPIC: &str = "/cri-imaged/watching";
/// Publishing needs a namespace; the CRI's is the one cri-imaged works in.
const NAMESPACE: &str = "k8s.io";
/// How often the marker is published while the stream is silent, and how many times.
const MARKER_INTERVAL: Duration = Duration::from_millis(100);
const MARKER_ATTEMPTS: u32 = 50;
/// Waits between attempts to watch again.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why watching stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("the runtime has no containerd event service: {}", .0.message())]
    Unsupported(tonic::Status),
    #[error("the image event stream failed: {}", .0.message())]
    Stream(tonic::Status),
    #[error("the image event stream ended")]
    Ended,
    #[error("our marker event never came back on the stream")]
    MarkerLost,
}

impl From<tonic::Status> for WatchError {
    fn from(status: tonic::Status) -> Self {
        if status.code() == tonic::Code::Unimplemented { Self::Unsupported(status) } else { Self::Stream(status) }
    }
}

/// Keeps `cache` watching the runtime's image events for as long as the runtime offers them,
/// subscribing again after failures (the runtime restarted, say).
pub async fn watch(channel: Channel, cache: Arc<PresenceCache>) {
    let mut retry = RETRY_MIN;
    loop {
        let error = watch_once(channel.clone(), &cache).await;
        if cache.is_watching() {
            retry = RETRY_MIN;
        }
        cache.set_watching(false);
        if let WatchError::Unsupported(_) = error {
            tracing::info!(%error, "presence checks will always ask the runtime");
            return;
        }
        tracing::warn!(%error, retry_in = ?retry, "presence checks ask the runtime until image events are watched again");
        tokio::time::sleep(retry).await;
        retry = retry.saturating_mul(2).min(RETRY_MAX);
    }
}

/// Subscribes, waits for proof that the subscription is live, then follows the stream.
async fn watch_once(channel: Channel, cache: &PresenceCache) -> WatchError {
    let mut client = EventsClient::new(channel);
    let filters = vec![r#"topic~="^/images/""#.to_owned(), format!(r#"topic=="{MARKER_TOPIC}""#)];
    let mut subscriber = client.clone();
    let subscribe = subscriber.subscribe(SubscribeRequest { filters });
    tokio::pin!(subscribe);
    let mut markers = tokio::time::interval(MARKER_INTERVAL);
    let mut published = 0;
    let mut stream = loop {
        tokio::select! {
            biased;
            response = &mut subscribe => match response {
                Ok(response) => break response.into_inner(),
                Err(status) => return status.into(),
            },
            _ = markers.tick() => {
                if published == MARKER_ATTEMPTS {
                    return WatchError::MarkerLost;
                }
                if let Err(status) = publish_marker(&mut client).await {
                    return status.into();
                }
                published += 1;
            }
        }
    };
    loop {
        let envelope = match stream.message().await {
            Ok(Some(envelope)) => envelope,
            Ok(None) => return WatchError::Ended,
            Err(status) => return status.into(),
        };
        // Whatever comes first proves the subscription is registered.
        if !cache.is_watching() {
            cache.set_watching(true);
            tracing::info!("watching the runtime's image events; presence answers are remembered");
        }
        if envelope.topic != MARKER_TOPIC {
            tracing::debug!(topic = %envelope.topic, namespace = %envelope.namespace, "image event");
            cache.image_changed();
        }
    }
}

async fn publish_marker(client: &mut EventsClient<Channel>) -> Result<(), tonic::Status> {
    let empty = prost_types::Any { type_url: "type.googleapis.com/google.protobuf.Empty".into(), value: Vec::new() };
    let mut request = tonic::Request::new(PublishRequest { topic: MARKER_TOPIC.into(), event: Some(empty) });
    request.metadata_mut().insert("containerd-namespace", tonic::metadata::MetadataValue::from_static(NAMESPACE));
    request.set_timeout(Duration::from_secs(5));
    client.publish(request).await.map(drop)
}
