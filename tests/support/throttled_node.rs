//! A node whose registry is slow: the local stack, its registry behind a throttle proxy, and the
//! cri-imaged binary serving on its containerd, so that a pull of a few MiB takes seconds.

use std::net::SocketAddr;

use cri_imaged::api::image_manager_client::ImageManagerClient;
use tonic::transport::Channel;

use super::{process::DaemonProcess, stack::LocalStack, throttle::ThrottleProxy, unix_channel};

/// The running node. Fields drop in order: the daemon before containerd and the registry go.
pub struct ThrottledNode {
    /// cri-imaged; a test may kill it and put another on the same socket.
    pub daemon: DaemonProcess,
    /// Images named by [`ThrottleProxy::image`] are pulled through it.
    pub proxy: ThrottleProxy,
    pub stack: LocalStack,
    _dir: tempfile::TempDir,
}

impl ThrottledNode {
    /// Seeds `images` (name:tag, random bytes), puts a proxy of `rate` bytes a second in front of
    /// the registry and starts cri-imaged with `flags`. `None` (outside CI) when this machine
    /// cannot run the stack.
    pub async fn start(images: &[(&str, u64)], rate: u64, flags: &[&str]) -> Option<Self> {
        let stack = LocalStack::start()?;
        for (name, bytes) in images {
            stack.seed_sized(name, *bytes);
        }
        let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
        let proxy = ThrottleProxy::start(registry, rate).await;
        stack.route_through(proxy.addr.port());
        let dir = tempfile::tempdir().expect("tempdir");
        // A short path: `top`'s banner names the socket and must fit in 80 columns.
        let daemon = DaemonProcess::start(&dir.path().join("d.sock"), &stack.containerd_socket, flags).await;
        Some(Self { daemon, proxy, stack, _dir: dir })
    }

    /// A client of the daemon's ImageManager.
    pub fn client(&self) -> ImageManagerClient<Channel> {
        ImageManagerClient::new(unix_channel(&self.daemon.socket))
    }
}
