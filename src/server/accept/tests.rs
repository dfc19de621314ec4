use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const LIMITS: ConnectionLimits = ConnectionLimits {
    max_connections: 2,
    handshake_timeout: Duration::from_secs(10),
    reserved: 0,
    reserved_uid: None,
    per_client: 64,
};

/// A connection as the accept loop admits it, over an in-memory pipe; the other end.
fn admitted(metrics: &Arc<ConnectionMetrics>) -> (Admitted<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
    let (ours, theirs) = tokio::io::duplex(1024);
    let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("a slot");
    let handshake = HandshakeWait::new(LIMITS.handshake_timeout, metrics.clone());
    (Admitted { inner: ours, _slot: slot, handshake: Some(handshake), client: None, groups: Arc::default() }, theirs)
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_sends_the_preface_is_closed_at_the_handshake_timeout() {
    let metrics = Arc::new(ConnectionMetrics::default());
    let (mut connection, _client) = admitted(&metrics);
    let started = Instant::now();
    let error = connection.read(&mut [0; 64]).await.expect_err("closed");
    assert_eq!(started.elapsed(), LIMITS.handshake_timeout);
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    assert_eq!(error.to_string(), "no HTTP/2 preface within 10s (--connection-handshake-timeout)");
    assert_eq!(metrics.closed_total(Closed::HandshakeTimeout), 1);
}

#[tokio::test(start_paused = true)]
async fn once_the_preface_came_in_pieces_a_quiet_connection_stays() {
    let metrics = Arc::new(ConnectionMetrics::default());
    let (mut connection, mut client) = admitted(&metrics);
    let mut buf = [0; 64];
    for piece in PREFACE.chunks(10) {
        client.write_all(piece).await.expect("written");
        assert_eq!(connection.read(&mut buf).await.expect("read"), piece.len());
    }
    let quiet = tokio::time::timeout(Duration::from_secs(3600), connection.read(&mut buf)).await;
    assert!(quiet.is_err(), "still open an hour later: {quiet:?}");
    assert_eq!(metrics.closed_total(Closed::HandshakeTimeout), 0);
}

/// Connects to `socket`, sending the preface when `speaks`.
async fn connect(socket: &std::path::Path, speaks: bool) -> UnixStream {
    let mut client = UnixStream::connect(socket).await.expect("connects");
    if speaks {
        client.write_all(PREFACE).await.expect("preface sent");
    }
    client
}

/// Reads an admitted connection as hyper would, in a task that ends with how the reads ended.
fn serve_reads(mut connection: Admitted<UnixStream>) -> tokio::task::JoinHandle<io::ErrorKind> {
    tokio::spawn(async move {
        let mut buf = [0; 64];
        loop {
            match connection.read(&mut buf).await {
                Ok(0) => return io::ErrorKind::UnexpectedEof,
                Ok(_) => {}
                Err(error) => return error.kind(),
            }
        }
    })
}

#[tokio::test]
async fn at_the_cap_a_connection_in_its_handshake_gives_its_place_and_else_the_newcomer_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("s.sock");
    let metrics = Arc::new(ConnectionMetrics::default());
    let incoming = connections(UnixListener::bind(&socket).expect("binds"), LIMITS, metrics.clone());
    let (admitted, mut admissions) = tokio::sync::mpsc::unbounded_channel();
    let accepting = tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        while let Some(Ok(connection)) = futures_util::StreamExt::next(&mut incoming).await {
            if admitted.send(connection).is_err() {
                return;
            }
        }
    });
    let mut next = async || {
        let accepted = tokio::time::timeout(Duration::from_secs(5), admissions.recv()).await;
        accepted.expect("accepted in time").expect("the accept loop runs")
    };
    let _silent = connect(&socket, false).await;
    let silent = serve_reads(next().await);
    let _speaking = connect(&socket, true).await;
    let speaking = serve_reads(next().await);

    let mut newcomer = connect(&socket, false).await;
    let newcomer_served = serve_reads(next().await);
    assert_eq!(silent.await.expect("read task"), io::ErrorKind::ConnectionAborted, "the silent one made room");
    assert_eq!(metrics.closed_total(Closed::Displaced), 1);
    newcomer.write_all(PREFACE).await.expect("the newcomer speaks");
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut refused = connect(&socket, true).await;
    let end = tokio::time::timeout(Duration::from_secs(5), refused.read(&mut [0; 8])).await.expect("closed at once");
    assert!(matches!(end, Ok(0) | Err(_)), "closed without an answer: {end:?}");
    assert_eq!(metrics.closed_total(Closed::Refused), 1);
    assert!(!speaking.is_finished() && !newcomer_served.is_finished(), "both speaking connections stay");
    accepting.abort();
}

#[test]
fn the_cap_fits_the_open_file_limit_with_room_beside_and_keeps_one_open_place() {
    let limits = ConnectionLimits { max_connections: 1024, reserved: 32, ..LIMITS };
    assert_eq!(limits.fitted_to(65_536), (limits, None));
    let (fitted, lowered) = limits.fitted_to(200);
    assert_eq!((fitted.max_connections, lowered), (136, Some(136)));
    assert_eq!(limits.fitted_to(10).0.max_connections, 1, "always one");
    assert_eq!(fitted.places(), (104, 32));
    let one = ConnectionLimits { max_connections: 1, reserved: 32, ..LIMITS };
    assert_eq!(one.places(), (1, 0), "never every place reserved");
    let kubelet = ConnectionLimits { reserved_uid: Some(996), ..LIMITS };
    assert!(kubelet.privileged(Some(0)) && kubelet.privileged(Some(996)));
    assert!(!kubelet.privileged(Some(1000)) && !kubelet.privileged(None));
}

#[test]
fn waits_double_up_to_a_second() {
    let mut waited = ACCEPT_WAITS;
    let waits: Vec<u128> = (0..10).map(|_| waited.next_wait().as_millis()).collect();
    assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
}

#[test]
fn only_a_connection_level_failure_is_tried_again_at_once() {
    assert!(only_this_connection(&io::Error::from(io::ErrorKind::ConnectionAborted)));
    assert!(!only_this_connection(&io::Error::from_raw_os_error(24)), "EMFILE waits");
    assert!(!only_this_connection(&io::Error::from_raw_os_error(23)), "ENFILE waits");
}
