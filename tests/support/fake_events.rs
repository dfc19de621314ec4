//! containerd's event service, faked: every subscriber gets events in the order they were
//! published, as containerd's exchange hands them out, and a test may hold delivery back to play
//! an event that is slow to arrive.

use std::sync::{Arc, Mutex};

use cri_imaged::runtime::containerd::events::{
    Envelope, PublishRequest, SubscribeRequest,
    events_server::{Events, EventsServer},
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status};

/// Shared handle on the fake; cheap to clone.
#[derive(Clone, Default)]
pub struct FakeEvents {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    subscribers: Vec<mpsc::UnboundedSender<Result<Envelope, Status>>>,
    /// While some, published events wait here, in order, instead of being delivered.
    held: Option<Vec<Envelope>>,
}

impl FakeEvents {
    /// The gRPC service to serve beside the fake image service.
    pub fn server(&self) -> EventsServer<Self> {
        EventsServer::new(self.clone())
    }

    /// Publishes an event on `topic` (the runtime's own, such as `/images/delete`).
    pub fn publish(&self, topic: &str, event: Option<prost_types::Any>) {
        let envelope = Envelope { topic: topic.into(), namespace: "k8s.io".into(), event, ..Default::default() };
        let mut state = self.state.lock().unwrap();
        match &mut state.held {
            Some(held) => held.push(envelope),
            None => state.subscribers.retain(|subscriber| subscriber.send(Ok(envelope.clone())).is_ok()),
        }
    }

    /// Holds every event published from now on until [`FakeEvents::release`].
    pub fn hold(&self) {
        self.state.lock().unwrap().held.get_or_insert_with(Vec::new);
    }

    /// Delivers the held events, in order, and stops holding.
    pub fn release(&self) {
        let mut state = self.state.lock().unwrap();
        for envelope in state.held.take().unwrap_or_default() {
            state.subscribers.retain(|subscriber| subscriber.send(Ok(envelope.clone())).is_ok());
        }
    }

    /// Ends every subscription, as a runtime restart would.
    pub fn disconnect_all(&self) {
        self.state.lock().unwrap().subscribers.clear();
    }
}

#[tonic::async_trait]
impl Events for FakeEvents {
    type SubscribeStream = UnboundedReceiverStream<Result<Envelope, Status>>;

    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<()>, Status> {
        let PublishRequest { topic, event } = request.into_inner();
        FakeEvents::publish(self, &topic, event);
        Ok(Response::new(()))
    }

    async fn subscribe(&self, _: Request<SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let (subscriber, stream) = mpsc::unbounded_channel();
        self.state.lock().unwrap().subscribers.push(subscriber);
        Ok(Response::new(UnboundedReceiverStream::new(stream)))
    }
}
