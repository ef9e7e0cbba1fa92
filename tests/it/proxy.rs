//! A TCP proxy of the tests' own between a replica and PostgreSQL, to
//! make the faults a network makes: a partition (it freezes: forwards
//! nothing either way and closes nothing, at once or the moment a chosen
//! statement has gone out), and a restart of the database as its clients
//! see it (every connection closed, new ones refused for a while).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

/// What the link lets through now.
#[derive(Debug, Clone, Copy, Default)]
struct Link {
    /// Nothing passes, either way; nothing is closed.
    frozen: bool,
    /// Connections numbered below this were open when a cut healed
    /// without them: they stay silent for good.
    lost_below: u64,
}

impl Link {
    fn passes(&self, connection: u64) -> bool {
        !self.frozen && connection >= self.lost_below
    }
}

/// How long after a cut heals the server's TCP keepalives
/// (`tcp_keepalives_idle` 2 s, then 3 probes a second apart) end the
/// sessions of connections the heal lost.
const KEEPALIVE_VERDICT: Duration = Duration::from_secs(5);

/// A TCP proxy to PostgreSQL that can freeze: then it forwards nothing
/// either way and closes nothing. `freeze_after(text)` freezes the moment
/// a client has sent the execution of a statement whose SQL contains
/// `text` (forwarded first, so the server runs it).
pub(crate) struct FreezingProxy {
    pub(crate) url: String,
    link: watch::Sender<Link>,
    /// The number the next connection gets.
    next: Arc<std::sync::atomic::AtomicU64>,
    trigger: Arc<Mutex<Option<String>>>,
    /// Bumped to close every connection open now.
    severed: watch::Sender<u64>,
    /// New connections are closed at once until then.
    refuse_until: Arc<Mutex<Option<Instant>>>,
}

impl FreezingProxy {
    pub(crate) async fn start(db_url: &str) -> FreezingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (link, _) = watch::channel(Link::default());
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let trigger = Arc::new(Mutex::new(None::<String>));
        let (severed, _) = watch::channel(0u64);
        let refuse_until = Arc::new(Mutex::new(None::<Instant>));
        let (l, n, t, cut, refuse) = (
            link.clone(),
            next.clone(),
            trigger.clone(),
            severed.clone(),
            refuse_until.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let refused = refuse
                    .lock()
                    .expect("refuse")
                    .is_some_and(|until| Instant::now() < until);
                if refused {
                    // The database is down: the connection is closed.
                    drop(client);
                    continue;
                }
                let id = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (l, t) = (l.clone(), t.clone());
                let mut cut = cut.subscribe();
                tokio::spawn(async move {
                    // A connection opened while frozen hangs, as in a
                    // partition.
                    let mut seen = l.subscribe();
                    tokio::select! {
                        _ = seen.wait_for(|x| x.passes(id)) => {}
                        _ = cut.changed() => return,
                    }
                    let Ok(up) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    let ((mut cr, mut cw), (mut ur, mut uw)) =
                        (client.into_split(), up.into_split());
                    let lost = async {
                        let _ = seen.wait_for(|x| id < x.lost_below).await;
                        tokio::time::sleep(KEEPALIVE_VERDICT).await;
                    };
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                pump(&mut ur, &mut cw, id, &l, None),
                                pump(&mut cr, &mut uw, id, &l, Some(&t)),
                            )
                        } => return,
                        // Severed: both sockets dropped, so both ends see
                        // the connection closed.
                        _ = cut.changed() => return,
                        _ = lost => {}
                    }
                    // Lost at a heal: the server's keepalives end its
                    // session, while the client hears nothing, ever,
                    // until it gives the connection up itself.
                    drop((ur, uw));
                    let mut sink = vec![0u8; 64 * 1024];
                    while matches!(cr.read(&mut sink).await, Ok(n) if n > 0) {}
                    drop(cw);
                });
            }
        });
        let url = db_url.replacen("127.0.0.1:5432", &format!("127.0.0.1:{port}"), 1);
        assert_ne!(
            url, db_url,
            "the test PostgreSQL is expected on 127.0.0.1:5432"
        );
        // In clear, so that the proxy can see which statement runs.
        let url = format!("{url}?sslmode=disable");
        FreezingProxy {
            url,
            link,
            next,
            trigger,
            severed,
            refuse_until,
        }
    }

    /// Freezes the moment a client has sent the execution of a statement
    /// whose SQL contains `sql`.
    pub(crate) fn freeze_after(&self, sql: &str) {
        *self.trigger.lock().expect("trigger") = Some(sql.into());
    }

    /// Freezes now.
    pub(crate) fn freeze(&self) {
        self.link.send_modify(|l| l.frozen = true);
    }

    /// The cut heals: what was held goes through, as a link that only
    /// paused.
    pub(crate) fn thaw(&self) {
        *self.trigger.lock().expect("trigger") = None;
        self.link.send_modify(|l| l.frozen = false);
    }

    /// The cut heals, but what was open during it is lost, as behind a
    /// NAT or firewall that forgot the flows: new connections work, the
    /// old ones never pass another byte, and the server ends their
    /// sessions once its keepalives give up.
    pub(crate) fn heal_losing_open(&self) {
        *self.trigger.lock().expect("trigger") = None;
        let below = self.next.load(std::sync::atomic::Ordering::SeqCst);
        self.link.send_modify(|l| {
            l.frozen = false;
            l.lost_below = below;
        });
    }

    /// The database restarts, as its clients see it through this proxy:
    /// every connection open now is closed, and new ones are closed at
    /// once for `down`.
    pub(crate) fn restart(&self, down: Duration) {
        *self.refuse_until.lock().expect("refuse") = Some(Instant::now() + down);
        self.severed.send_modify(|n| *n += 1);
    }

    /// Waits until frozen; answers when.
    pub(crate) async fn frozen_within(&self, within: Duration) -> Instant {
        let t = Instant::now();
        while !self.link.borrow().frozen {
            assert!(t.elapsed() < within, "the proxy never froze");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Instant::now()
    }
}

/// Forwards `from` to `to` while the link passes connection `id`; with a
/// `trigger`, freezes the link once a statement containing it has gone
/// out.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    id: u64,
    link: &watch::Sender<Link>,
    trigger: Option<&Arc<Mutex<Option<String>>>>,
) {
    let mut passes = link.subscribe();
    let mut seen = Frontend::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if passes.wait_for(|l| l.passes(id)).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Froze meanwhile: hold the bytes until it passes again.
        if passes.wait_for(|l| l.passes(id)).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some(t) = trigger {
            let needle = t.lock().expect("trigger").clone();
            if seen.feed(&buf[..n], needle.as_deref()) {
                *t.lock().expect("trigger") = None;
                link.send_modify(|l| l.frozen = true);
            }
        }
    }
}

/// Just enough of PostgreSQL's frontend protocol to see which statement a
/// Bind or Query runs: sqlx parses a statement once per connection under
/// a name, then binds it by name.
#[derive(Default)]
struct Frontend {
    started: bool,
    pending: Vec<u8>,
    names: HashMap<String, String>,
}

impl Frontend {
    /// Reads `bytes`; true when they executed a statement containing
    /// `needle`.
    fn feed(&mut self, bytes: &[u8], needle: Option<&str>) -> bool {
        fn cstr(b: &[u8]) -> (String, usize) {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            (
                String::from_utf8_lossy(&b[..end]).into_owned(),
                (end + 1).min(b.len()),
            )
        }
        self.pending.extend_from_slice(bytes);
        let mut hit = false;
        loop {
            let head = if self.started { 5 } else { 4 };
            if self.pending.len() < head {
                return hit;
            }
            let len =
                u32::from_be_bytes(self.pending[head - 4..head].try_into().expect("four bytes"))
                    as usize;
            let total = len + head - 4;
            if self.pending.len() < total {
                return hit;
            }
            let msg: Vec<u8> = self.pending.drain(..total).collect();
            if !self.started {
                self.started = true;
                continue;
            }
            let body = &msg[5..];
            let has = |sql: &str| needle.is_some_and(|n| sql.contains(n));
            match msg[0] {
                b'P' => {
                    let (name, k) = cstr(body);
                    let (sql, _) = cstr(&body[k..]);
                    self.names.insert(name, sql);
                }
                b'B' => {
                    let (_, k) = cstr(body);
                    let (statement, _) = cstr(&body[k..]);
                    hit |= self.names.get(&statement).is_some_and(|s| has(s));
                }
                b'Q' => hit |= has(&cstr(body).0),
                _ => {}
            }
        }
    }
}
