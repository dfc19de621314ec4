//! Each client's share of connections (`--max-connections-per-client`): how many that have begun
//! HTTP/2 each process holds, by [`ClientKey`].

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use crate::server::peer::ClientKey;

/// Connections that have begun HTTP/2, by the process that holds them.
#[derive(Default)]
pub(super) struct Clients {
    by_client: Mutex<HashMap<ClientKey, usize>>,
}

impl Clients {
    /// Counts one more connection of `client`, unless it holds `most` already.
    pub(super) fn join(self: &Arc<Self>, client: ClientKey, most: usize) -> Option<ClientHold> {
        let mut by_client = self.by_client.lock().unwrap_or_else(PoisonError::into_inner);
        let held = by_client.entry(client).or_default();
        if *held >= most {
            return None;
        }
        *held += 1;
        Some(ClientHold { clients: self.clone(), client })
    }
}

/// One counted connection of a client; uncounted when it closes.
pub(super) struct ClientHold {
    clients: Arc<Clients>,
    client: ClientKey,
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let mut by_client = self.clients.by_client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = by_client.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                by_client.remove(&self.client);
            }
        }
    }
}
