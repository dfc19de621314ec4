//! Load shapes: a closed loop of callers for a while, a herd of callers released at once, and a
//! fixed list of calls worked through a few at a time.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::Barrier;

/// What one closed-loop run measured.
#[derive(Debug, Default)]
pub struct Run {
    /// Latency of every successful call, in microseconds.
    pub latencies_us: Vec<u32>,
    pub elapsed: Duration,
    pub errors: Vec<String>,
}

impl Run {
    /// Adds another run of the same side.
    pub fn absorb(&mut self, other: Run) {
        self.latencies_us.extend(other.latencies_us);
        self.elapsed += other.elapsed;
        self.errors.extend(other.errors);
    }

    pub fn requests_per_second(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q`-quantile (0..=1) latency, nearest rank; needs sorted latencies.
    pub fn quantile_us(&self, q: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        let rank = (q * self.latencies_us.len() as f64).ceil() as usize;
        self.latencies_us[rank.clamp(1, self.latencies_us.len()) - 1]
    }

    pub fn sort(&mut self) {
        self.latencies_us.sort_unstable();
    }
}

/// `concurrency` callers each call `call(caller)` back to back until `duration` has passed;
/// every call's latency is kept.
pub async fn closed_loop<F, Fut>(concurrency: usize, duration: Duration, call: F) -> Run
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let callers: Vec<_> = (0..concurrency)
        .map(|caller| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut run = Run::default();
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    match call(caller).await {
                        Ok(()) => run.latencies_us.push(micros(sent.elapsed())),
                        Err(error) => run.errors.push(error),
                    }
                }
                run
            })
        })
        .collect();
    let mut total = Run::default();
    for caller in callers {
        total.absorb(caller.await.expect("a load caller panicked"));
    }
    total.elapsed = started.elapsed();
    total
}

/// What one herd measured.
#[derive(Debug)]
pub struct Herd {
    /// From the release of the herd until the last answer.
    pub wall: Duration,
    pub errors: Vec<String>,
}

/// `size` callers, released together, each making one call `call(index)`.
pub async fn herd<F, Fut>(size: usize, call: F) -> Herd
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let start = Arc::new(Barrier::new(size + 1));
    let callers: Vec<_> = (0..size)
        .map(|index| {
            let (call, start) = (call.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                call(index).await
            })
        })
        .collect();
    start.wait().await;
    let released = Instant::now();
    let mut errors = Vec::new();
    for caller in callers {
        if let Err(error) = caller.await.expect("a herd caller panicked") {
            errors.push(error);
        }
    }
    Herd { wall: released.elapsed(), errors }
}

/// Calls `call(index)` once for every index in `indices`, `concurrency` at a time; returns the
/// errors.
pub async fn for_each<F, Fut>(indices: std::ops::Range<usize>, concurrency: usize, call: F) -> Vec<String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let next = Arc::new(AtomicUsize::new(indices.start));
    let end = indices.end;
    let callers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (call, next) = (call.clone(), next.clone());
            tokio::spawn(async move {
                let mut errors = Vec::new();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= end {
                        return errors;
                    }
                    if let Err(error) = call(index).await {
                        errors.push(error);
                    }
                }
            })
        })
        .collect();
    let mut errors = Vec::new();
    for caller in callers {
        errors.extend(caller.await.expect("a load caller panicked"));
    }
    errors
}

fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}
