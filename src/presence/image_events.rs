//! containerd's image events, watched so that the presence cache never outlives a change.
//!
//! containerd sends a stream's headers only with its first event, so a subscription gives no sign
//! of being registered. We publish a marker event of our own until it comes back on the stream:
//! from then on every image event reaches us, and only then does the cache remember anything.
//! Each marker is also a barrier: containerd hands events to a subscriber in the order they were
//! published, so when a marker comes back, every event published before it was sent has been
//! applied, and the cache is current as of the moment we sent it. The cache asks for barriers
//! as it needs them (see [`super`]).
//! Runtimes without containerd's event service (CRI-O) answer UNIMPLEMENTED; watching then ends,
//! and [`super::signal`] looks for another signal.

use std::{
    collections::VecDeque,
    hash::{BuildHasher, RandomState},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;
use tonic::transport::Channel;

use super::{PresenceCache, SETTLE, Signal};
use crate::{retry::Doubling, shutdown::Shutdown};

use crate::runtime::containerd::events::{PublishRequest, SubscribeRequest, events_client::EventsClient};

/// The topic of our marker event.
const MARKER_TOPIC: &str = "/cri-imaged/watching";
/// How a marker's payload is typed: a `google.protobuf.StringValue`, which `ctr events` can show.
const MARKER_TYPE: &str = "type.googleapis.com/google.protobuf.StringValue";
/// The most markers awaited at once; older ones are given up as lost.
const MARKERS_IN_FLIGHT: usize = 64;
/// A marker not back within this long means the stream has stalled: subscribe again rather than
/// let every hit wait for a proof that will not come.
const MARKER_DEADLINE: Duration = Duration::from_secs(2);
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
    #[error("our marker event did not come back on the stream")]
    MarkerLost,
}

impl From<tonic::Status> for WatchError {
    fn from(status: tonic::Status) -> Self {
        if status.code() == tonic::Code::Unimplemented { Self::Unsupported(status) } else { Self::Stream(status) }
    }
}

/// Why [`watch`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The runtime has no containerd event service.
    Unsupported,
    /// Shutdown was requested.
    Stopped,
}

/// Keeps `cache` watching the runtime's image events for as long as the runtime offers them,
/// subscribing again after failures (the runtime restarted, say), until shutdown.
pub async fn watch(channel: Channel, cache: Arc<PresenceCache>, shutdown: Shutdown) -> Finished {
    cache.set_signal(Signal::ContainerdEvents);
    let stopping = shutdown.requested();
    tokio::pin!(stopping);
    let mut retries = Doubling::new(RETRY_MIN, RETRY_MAX);
    let mut markers = Markers::new(cache.clone());
    loop {
        let error = tokio::select! {
            error = watch_once(channel.clone(), &cache, &mut markers) => error,
            () = &mut stopping => {
                cache.set_watching(false);
                return Finished::Stopped;
            }
        };
        if cache.is_watching() {
            retries.reset();
        }
        cache.set_watching(false);
        if let WatchError::Unsupported(_) = error {
            tracing::info!(%error, "containerd's image events cannot be watched");
            return Finished::Unsupported;
        }
        let retry = retries.next_wait();
        tracing::warn!(%error, retry_in = ?retry, "presence checks ask the runtime until image events are watched again");
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            () = &mut stopping => return Finished::Stopped,
        }
    }
}

/// Subscribes, waits for proof that the subscription is live, then follows the stream, sending
/// a barrier whenever the cache asks for one.
async fn watch_once(channel: Channel, cache: &PresenceCache, markers: &mut Markers) -> WatchError {
    let mut client = EventsClient::new(channel);
    markers.new_subscription();
    let filters = vec![r#"topic~="^/images/""#.to_owned(), format!(r#"topic=="{MARKER_TOPIC}""#)];
    let mut subscriber = client.clone();
    let subscribe = subscriber.subscribe(SubscribeRequest { filters });
    tokio::pin!(subscribe);
    let mut ticks = tokio::time::interval(MARKER_INTERVAL);
    let mut stream = loop {
        tokio::select! {
            biased;
            response = &mut subscribe => match response {
                Ok(response) => break response.into_inner(),
                Err(status) => return status.into(),
            },
            _ = ticks.tick() => {
                if let Err(error) = markers.prove_live(&mut client).await {
                    return error;
                }
            }
        }
    };
    // Armed by each image event: forget once more when the runtime's CRI layer has caught up.
    let mut settle_at: Option<Instant> = None;
    loop {
        let envelope = tokio::select! {
            biased;
            message = stream.message() => match message {
                Ok(Some(envelope)) => envelope,
                Ok(None) => return WatchError::Ended,
                Err(status) => return status.into(),
            },
            () = tokio::time::sleep_until(settle_at.unwrap_or_else(Instant::now)), if settle_at.is_some() => {
                settle_at = None;
                cache.image_changed();
                continue;
            }
            () = cache.barrier_wanted() => {
                if let Err(status) = markers.publish(&mut client).await {
                    return status.into();
                }
                continue;
            }
            _ = ticks.tick() => {
                if markers.oldest_sent().is_some_and(|sent| sent.elapsed() > MARKER_DEADLINE) {
                    return WatchError::MarkerLost;
                }
                // A server that answers the subscription before any event (unlike containerd)
                // gets markers until one comes back.
                if !cache.is_watching() && let Err(error) = markers.prove_live(&mut client).await {
                    return error;
                }
                continue;
            }
        };
        // Whatever comes first proves the subscription is registered.
        if !cache.is_watching() {
            cache.set_watching(true);
            tracing::info!("watching the runtime's image events; presence answers are remembered");
        }
        if envelope.topic == MARKER_TOPIC {
            markers.returned(envelope.event.as_ref());
        } else {
            tracing::debug!(topic = %envelope.topic, namespace = %envelope.namespace, "image event");
            cache.image_changed();
            settle_at = Some(Instant::now() + SETTLE);
        }
    }
}

/// Our marker events: numbered, tagged with this process's nonce (another cri-imaged on the same
/// containerd sees them too), and remembered until they come back.
struct Markers {
    cache: Arc<PresenceCache>,
    nonce: u64,
    next: u64,
    /// Sent and not yet back, oldest first: number and when it was sent.
    in_flight: VecDeque<(u64, Instant)>,
    /// Markers sent on this subscription to prove it live.
    liveness_attempts: u32,
}

impl Markers {
    fn new(cache: Arc<PresenceCache>) -> Self {
        let nonce = RandomState::new().hash_one(std::process::id());
        Self { cache, nonce, next: 0, in_flight: VecDeque::new(), liveness_attempts: 0 }
    }

    /// Forgets the markers of an earlier subscription.
    fn new_subscription(&mut self) {
        self.in_flight.clear();
        self.liveness_attempts = 0;
    }

    /// Sends a marker to prove the subscription live, at most [`MARKER_ATTEMPTS`] times.
    async fn prove_live(&mut self, client: &mut EventsClient<Channel>) -> Result<(), WatchError> {
        if self.liveness_attempts == MARKER_ATTEMPTS {
            return Err(WatchError::MarkerLost);
        }
        self.liveness_attempts += 1;
        Ok(self.publish(client).await?)
    }

    /// When the oldest marker still awaited was sent.
    fn oldest_sent(&self) -> Option<Instant> {
        self.in_flight.front().map(|&(_, sent)| sent)
    }

    fn payload(&self, number: u64) -> String {
        format!("cri-imaged {:016x} {number}", self.nonce)
    }

    async fn publish(&mut self, client: &mut EventsClient<Channel>) -> Result<(), tonic::Status> {
        let number = self.next;
        self.next += 1;
        if self.in_flight.len() == MARKERS_IN_FLIGHT {
            self.in_flight.pop_front();
        }
        // Sent before containerd can see it: the proof never claims more than it shows.
        self.in_flight.push_back((number, Instant::now()));
        let event =
            prost_types::Any { type_url: MARKER_TYPE.into(), value: encode_string_value(&self.payload(number)) };
        let mut request = tonic::Request::new(PublishRequest { topic: MARKER_TOPIC.into(), event: Some(event) });
        request.metadata_mut().insert("containerd-namespace", tonic::metadata::MetadataValue::from_static(NAMESPACE));
        request.set_timeout(Duration::from_secs(5));
        client.publish(request).await?;
        self.cache.metrics().barrier();
        Ok(())
    }

    /// A marker came back: if it is ours, the cache is current as of when it was sent.
    fn returned(&mut self, event: Option<&prost_types::Any>) {
        let Some(number) = event.and_then(|event| decode_string_value(&event.value)).and_then(|text| {
            let (nonce, number) = text.strip_prefix("cri-imaged ")?.split_once(' ')?;
            (u64::from_str_radix(nonce, 16).ok()? == self.nonce).then(|| number.parse::<u64>().ok())?
        }) else {
            return;
        };
        // Markers come back in order; any older one still awaited was lost.
        while let Some(&(awaited, sent)) = self.in_flight.front() {
            if awaited > number {
                break;
            }
            self.in_flight.pop_front();
            if awaited == number {
                self.cache.proven_current_as_of(sent);
            }
        }
    }
}

/// A `google.protobuf.StringValue` (field 1, a string), encoded by hand.
fn encode_string_value(text: &str) -> Vec<u8> {
    let mut out = vec![0x0a];
    prost::encoding::encode_varint(text.len() as u64, &mut out);
    out.extend_from_slice(text.as_bytes());
    out
}

fn decode_string_value(mut bytes: &[u8]) -> Option<String> {
    let (&tag, rest) = bytes.split_first()?;
    bytes = rest;
    if tag != 0x0a {
        return None;
    }
    let length = usize::try_from(prost::encoding::decode_varint(&mut bytes).ok()?).ok()?;
    String::from_utf8(bytes.get(..length)?.to_vec()).ok()
}
