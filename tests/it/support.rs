//! A real flexq server for a test: in-process on port 0 with its own
//! database, or as a child process of the built binary.
//!
//! The database is a SQLite file in the test's directory, or, with
//! `FLEXQ_TEST_DATABASE=postgres`, a database of its own on the PostgreSQL
//! at `FLEXQ_TEST_PG` (default `postgres://postgres@127.0.0.1:5432/test`):
//! `scripts/test` runs the behaviour suite once on each.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flexq::config::Config;
use flexq::server::{App, run, run_metrics};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) struct TestServer {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    /// The `flexq serve` child when the server runs in a process of its
    /// own ([`TestServer::start_process_with`]).
    process: Option<ServerProcess>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// The default config without its virtual nodes: batches stay
    /// queued, so API tests see exactly what they create.
    pub(crate) async fn start() -> TestServer {
        Self::start_with(no_virtual_nodes).await
    }

    /// Capacity only from agents, with a lease of `lease`.
    pub(crate) async fn start_for_agents(lease: Duration) -> TestServer {
        Self::start_with(|c| {
            no_virtual_nodes(c);
            c.agents.lease_duration = lease;
        })
        .await
    }

    pub(crate) async fn start_with(tune: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::load_without_env(None).expect("default config");
        config.database.data_dir = dir.path().join("data");
        config.database.url = database_url(dir.path()).await;
        // Tests send bursts far above the per-project API quotas; the
        // limits have tests of their own.
        config.limits.mutations_per_minute = 1_000_000;
        config.limits.reads_per_minute = 1_000_000;
        config.limits.max_pending_per_project = 10_000_000;
        tune(&mut config);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let app = App::open(config, flexq::engine::ConfigSource::Given, shutdown.clone())
            .await
            .expect("open app");
        let metrics = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let metrics_addr = metrics.local_addr().expect("addr");
        tokio::spawn(run_metrics(metrics, app.clone(), shutdown.clone()));
        tokio::spawn(run(listener, app, shutdown.clone()));
        TestServer {
            addr,
            metrics_addr,
            http: reqwest::Client::new(),
            shutdown,
            process: None,
            _dir: dir,
        }
    }

    /// The same config (the default, then `tune`) served by a `flexq
    /// serve` process of its own: its metrics move for this test alone,
    /// so a test can assert exact deltas of process-wide counters. The
    /// config file is layered over the embedded default, as `flexq serve
    /// --config` does: a zone or pool `tune` removes comes back from the
    /// default, so empty it (`max_nodes`, `virtual_nodes` 0) instead.
    pub(crate) async fn start_process_with(tune: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::load_without_env(None).expect("default config");
        tune(&mut config);
        let path = dir.path().join("flexq.toml");
        std::fs::write(&path, toml::to_string(&config).expect("the config as TOML"))
            .expect("write the config");
        let process = match &config.server.tls_cert {
            Some(cert) => ServerProcess::start_tls(dir.path(), &path, cert).await,
            None => ServerProcess::start_with(dir.path(), Some(&path)).await,
        };
        let addr = |endpoint: &str| {
            endpoint
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .parse()
                .expect("an address")
        };
        TestServer {
            addr: addr(&process.endpoint),
            metrics_addr: addr(&process.metrics_endpoint),
            http: reqwest::Client::new(),
            shutdown: CancellationToken::new(),
            process: Some(process),
            _dir: dir,
        }
    }

    /// A server started by [`TestServer::start_process_with`] (not on
    /// HTTPS), SIGKILLed and started again on the same database and
    /// config, on new ports.
    pub(crate) async fn restart_process(&mut self) {
        let process = self.process.as_mut().expect("a server in a process");
        process.kill9();
        let dir = self._dir.path();
        let again = ServerProcess::start_with(dir, Some(&dir.join("flexq.toml"))).await;
        let addr = |endpoint: &str| {
            endpoint
                .trim_start_matches("http://")
                .parse()
                .expect("an address")
        };
        self.addr = addr(&again.endpoint);
        self.metrics_addr = addr(&again.metrics_endpoint);
        self.process = Some(again);
    }

    /// HTTPS only, with `tls`'s certificate, no virtual nodes, then `tune`.
    pub(crate) async fn start_https(tls: &Tls, tune: impl FnOnce(&mut Config)) -> TestServer {
        let (cert, key) = (tls.cert.clone(), tls.key.clone());
        Self::start_with(move |c| {
            no_virtual_nodes(c);
            c.server.tls_cert = Some(cert);
            c.server.tls_key = Some(key);
            tune(c);
        })
        .await
    }

    /// The URL of the server's own database (SQLite file or PostgreSQL),
    /// for tests that look at or change what is stored directly.
    pub(crate) async fn database_url(&self) -> String {
        match database_url(self._dir.path()).await {
            Some(url) => url,
            None => format!(
                "sqlite://{}",
                self._dir.path().join("data").join("flexq.db").display()
            ),
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The text of `/metrics`.
    pub(crate) async fn scrape(&self) -> String {
        self.http
            .get(format!("http://{}/metrics", self.metrics_addr))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text")
    }

    pub(crate) fn batches(&self) -> String {
        self.url("/v1/projects/demo/locations/us-central1/batches")
    }

    /// POSTs a create; returns status and body.
    pub(crate) async fn create(&self, query: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}?{query}", self.batches()))
            .json(body)
            .send()
            .await
            .expect("create request");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON body"))
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.http.get(self.url(path)).send().await.expect("get");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON body"))
    }

    /// POSTs `body` as JSON; returns status and body.
    pub(crate) async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("post");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON body"))
    }

    pub(crate) async fn post(&self, path: &str) -> (u16, Value) {
        let resp = self.http.post(self.url(path)).send().await.expect("post");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON body"))
    }

    /// Cancels the batch `b` (as the API answers it) through its
    /// operation; the cancel must be accepted.
    pub(crate) async fn cancel(&self, b: &Value) {
        let op = b["operation"].as_str().expect("the batch's operation");
        let (status, body) = self.post(&format!("/v1/{op}:cancel")).await;
        assert_eq!(status, 200, "cancel of {op}: {body:#}");
    }

    pub(crate) async fn delete(&self, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .delete(self.url(path))
            .send()
            .await
            .expect("delete");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON body"))
    }

    /// Every batch of the demo project's region, following page tokens.
    pub(crate) async fn list_all(&self, query: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let (status, page) = self
                .get(&format!(
                    "/v1/projects/demo/locations/us-central1/batches?pageSize=1000&pageToken={token}&{query}"
                ))
                .await;
            assert_eq!(status, 200, "{page}");
            out.extend(page["batches"].as_array().cloned().unwrap_or_default());
            match page["nextPageToken"].as_str() {
                Some(t) if !t.is_empty() => token = t.to_string(),
                _ => return out,
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        // A server process first, so nothing holds its database.
        drop(self.process.take());
        // Its directory goes with it, and its database with that.
        drop(take_databases(|dir| dir == self._dir.path()));
        sweep_databases_of_removed_dirs();
    }
}

/// Removes the config's virtual nodes: capacity comes only from agents.
pub(crate) fn no_virtual_nodes(c: &mut Config) {
    for region in c.regions.values_mut() {
        for zone in region.zones.values_mut() {
            for pool in zone.node_pools.values_mut() {
                pool.virtual_nodes = 0;
            }
        }
    }
}

/// Writes a FAKE GPU discovery script into `dir`: two addresses in
/// Spark's format, no GPU behind them (these machines have none).
pub(crate) fn fake_gpu_script(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("fake-gpus.sh");
    let script = flexq::launch::discovery_script(&["0".into(), "1".into()]).replace(
        "# Generated by flexq",
        "# FAKE GPUs for tests (no hardware). Generated by flexq",
    );
    std::fs::write(&path, script).expect("fake GPU script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Where a test's `flexq agent` says its node is, and what it has.
pub(crate) struct AgentNode<'a> {
    pub node: &'a str,
    pub zone: &'a str,
    pub pool: &'a str,
    pub cores: u32,
    pub memory_mb: u64,
}

/// Writes `dir/agent.toml` for a `flexq agent` of `at` in us-central1,
/// serving `server`, with a FAKE GPU discovery script (two addresses) and
/// its work under `dir/work`, then `extra` (more keys, then any tables);
/// answers the file's path.
pub(crate) fn agent_config(server: &TestServer, dir: &Path, at: AgentNode, extra: &str) -> PathBuf {
    let script = fake_gpu_script(dir);
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server = \"http://{addr}\"\nnode_id = \"{node}\"\nregion = \"us-central1\"\n\
             zone = \"{zone}\"\npool = \"{pool}\"\ncores = {cores}\nmemory_mb = {memory_mb}\n\
             local_ssd_gb = 1500\ngpu_discovery_script = \"{script}\"\nwork_dir = \"{work}\"\n{extra}",
            addr = server.addr,
            node = at.node,
            zone = at.zone,
            pool = at.pool,
            cores = at.cores,
            memory_mb = at.memory_mb,
            script = script.display(),
            work = dir.join("work").display(),
        ),
    )
    .expect("agent config");
    config
}

/// Starts `flexq agent --config CONFIG`, its output appended to `log`.
pub(crate) fn spawn_agent(config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    Command::new(flexq_bin())
        .args(["agent", "--config"])
        .arg(config)
        .env_remove("FLEXQ_AGENT_SERVER")
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start flexq agent")
}

/// The flex start example of docs/rules.md#example as a create body.
pub(crate) fn flex_batch() -> Value {
    json!({
        "pysparkBatch": {"mainPythonFileUri": "file:///jobs/etl.py"},
        "runtimeConfig": {"version": "3.0", "properties": {
            "spark.dataproc.driver.resource.accelerator.type": "l4",
            "spark.dataproc.driver.provisioning.allocationTimeout": "1800s",
            "spark.dataproc.executor.resource.accelerator.type": "l4",
            "spark.dataproc.executor.provisioning.allocationTimeout": "1800s",
            "spark.dataproc.executor.compute.tier": "premium",
            "spark.dataproc.executor.disk.tier": "premium"
        }}
    })
}

/// The flex start batch with one property replaced.
pub(crate) fn flex_with(key: &str, value: &str) -> Value {
    let mut b = flex_batch();
    b["runtimeConfig"]["properties"][key] = json!(value);
    b
}

/// Whether a batch's whole cluster is allocated
/// (`flexq.provisioningState`).
pub(crate) fn provisioned(b: &Value) -> bool {
    b["flexq"]["provisioningState"] == "PROVISIONED"
}

/// A batch's state messages: its history's, then its current one.
pub(crate) fn state_messages(b: &Value) -> Vec<String> {
    b["stateHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["stateMessage"].as_str())
        .chain(b["stateMessage"].as_str())
        .map(str::to_string)
        .collect()
}

/// Asserts a `google.rpc.Status` body with the given HTTP code and status.
#[track_caller]
pub(crate) fn assert_status(status: u16, body: &Value, code: u16, name: &str) {
    assert_eq!(status, code, "{body:#}");
    assert_eq!(body["error"]["code"], code, "{body:#}");
    assert_eq!(body["error"]["status"], name, "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "an error has a message: {body:#}");
    let infos = body["error"]["details"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|x| x["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
                .count()
        })
        .unwrap_or(0);
    assert_eq!(infos, 1, "exactly one ErrorInfo: {body:#}");
}

/// The `flexq` binary built for these tests.
/// Whether this run of the suite is on PostgreSQL.
pub(crate) fn on_postgres() -> bool {
    std::env::var("FLEXQ_TEST_DATABASE").is_ok_and(|v| v == "postgres")
}

/// The PostgreSQL that test databases are made on.
pub(crate) fn postgres_admin_url() -> String {
    std::env::var("FLEXQ_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The database of a server whose data lives in `dir`: `None` for the
/// default SQLite file there; on PostgreSQL a database made for `dir`
/// (the same one again when the server restarts on `dir`), dropped once
/// `dir` is gone (see [`sweep_databases_of_removed_dirs`]).
pub(crate) async fn database_url(dir: &Path) -> Option<String> {
    if !on_postgres() {
        return None;
    }
    let marker = dir.join("postgres-url");
    if let Ok(url) = std::fs::read_to_string(&marker) {
        return Some(url);
    }
    sweep_databases_of_removed_dirs();
    let database = fresh_postgres_database().await;
    std::fs::create_dir_all(dir).expect("test dir");
    std::fs::write(&marker, &database.url).expect("write marker");
    let url = database.url.clone();
    DIR_DATABASES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((dir.to_path_buf(), database));
    Some(url)
}

/// The databases [`database_url`] made, with the directory each belongs
/// to: a server may be restarted on its directory, so its database lives
/// as long as the directory does.
static DIR_DATABASES: std::sync::Mutex<Vec<(PathBuf, PgDatabase)>> =
    std::sync::Mutex::new(Vec::new());

/// Drops the databases whose test directory is gone. Called whenever a
/// test server stops or a new database is made; `scripts/test` drops
/// what the last tests of a run leave.
pub(crate) fn sweep_databases_of_removed_dirs() {
    drop(take_databases(|dir| !dir.exists()));
}

/// Takes out of [`DIR_DATABASES`] those whose directory `which` picks
/// (dropped, they are dropped on the server).
fn take_databases(which: impl Fn(&Path) -> bool) -> Vec<PgDatabase> {
    let mut dirs = DIR_DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *dirs)
        .into_iter()
        .partition(|(dir, _)| which(dir));
    *dirs = kept;
    taken.into_iter().map(|(_, db)| db).collect()
}

/// A database of its own on the test PostgreSQL (`flexq_t_*`), dropped
/// (its sessions ended) when this value is.
pub(crate) struct PgDatabase {
    pub url: String,
    name: String,
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("FLEXQ_TEST_KEEP_FAILED").is_some() {
            eprintln!(
                "kept the failed test's database {} (FLEXQ_TEST_KEEP_FAILED)",
                self.name
            );
            return;
        }
        admin_statements(vec![format!(
            "drop database if exists {} with (force)",
            self.name
        )]);
    }
}

/// Runs `statements` in turn on the test PostgreSQL's admin database, from
/// a `Drop` (inside the test's runtime): on a thread of its own, with a
/// runtime of its own, waited for. A statement that fails is said, and
/// the next one runs.
pub(crate) fn admin_statements(statements: Vec<String>) {
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            use sqlx::{Connection, Executor};
            let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await else {
                return;
            };
            for sql in statements {
                if let Err(e) = conn.execute(sql.as_str()).await {
                    eprintln!("{sql}: {e}");
                }
            }
            let _ = conn.close().await;
        })
    });
    let _ = done.join();
}

/// Whether the operation `op` (a create's answer) warns of something
/// containing `text`.
pub(crate) fn warns(op: &Value, text: &str) -> bool {
    op["metadata"]["warnings"].as_array().is_some_and(|w| {
        w.iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(text)))
    })
}

/// A new, empty database on the test PostgreSQL (`flexq_t_*`), dropped
/// with the value answered. Its own database, not a schema: `NOTIFY`
/// channels and advisory locks are per database.
pub(crate) async fn fresh_postgres_database() -> PgDatabase {
    use sqlx::{Connection, Executor};
    let admin = postgres_admin_url();
    let name = format!("flexq_t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {admin} ({e}): scripts/test starts it"));
    let mut tries = 0;
    while let Err(e) = conn
        .execute(format!("create database {name}").as_str())
        .await
    {
        tries += 1;
        assert!(tries < 10, "create database {name}: {e}");
        tokio::time::sleep(Duration::from_millis(100 * tries)).await;
    }
    let _ = conn.close().await;
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    PgDatabase {
        url: format!("{base}/{name}"),
        name,
    }
}

pub(crate) fn flexq_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_flexq"))
}

/// The value of one series in a Prometheus exposition, named exactly as
/// it is written (`name{label="value",...}`); None when it is not there.
pub(crate) fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The text of `/metrics` from the metrics listener at `metrics` (its
/// `http://host:port`); None when it does not answer within a second.
pub(crate) async fn metrics_text(metrics: &str) -> Option<String> {
    reqwest::Client::new()
        .get(format!("{metrics}/metrics"))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// A `flexq serve` child process on a given data directory.
pub(crate) struct ServerProcess {
    pub child: Child,
    pub endpoint: String,
    pub metrics_endpoint: String,
}

impl ServerProcess {
    /// Starts `flexq serve` with its data under `dir`, and waits until it
    /// answers `/readyz`.
    pub(crate) async fn start(dir: &Path) -> ServerProcess {
        Self::start_with(dir, None).await
    }

    /// The same with a config file layered over the default.
    ///
    /// Its ports are picked free, then let go for the server to take: when
    /// another test took one meanwhile, the server says it cannot listen
    /// and is started again on others (not with a FIFO for its config:
    /// that is read once). It is ready when `/readyz` answers with its own
    /// replica id, not another test's server on a port it took. Its log
    /// (warnings and errors) is kept in `dir/flexq-serve.log` and shown
    /// when it does not start.
    pub(crate) async fn start_with(dir: &Path, config: Option<&Path>) -> ServerProcess {
        Self::start_limited(dir, config, None).await
    }

    /// The same, under a limit of `fd_limit` file descriptors (`ulimit -n`
    /// in a shell that then becomes the server) when one is given.
    pub(crate) async fn start_limited(
        dir: &Path,
        config: Option<&Path>,
        fd_limit: Option<u64>,
    ) -> ServerProcess {
        Self::start_serving(dir, config, fd_limit, None).await
    }

    /// Starts it with a config whose API port serves HTTPS only, with a
    /// certificate that `ca` signs (it is ready when `/readyz` answers
    /// over TLS).
    pub(crate) async fn start_tls(dir: &Path, config: &Path, ca: &Path) -> ServerProcess {
        Self::start_serving(dir, Some(config), None, Some(ca)).await
    }

    async fn start_serving(
        dir: &Path,
        config: Option<&Path>,
        fd_limit: Option<u64>,
        tls_ca: Option<&Path>,
    ) -> ServerProcess {
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port()
        };
        let log_path = dir.join("flexq-serve.log");
        for _ in 0..3 {
            let port = free_port();
            let metrics_port = free_port();
            let mut cmd = match fd_limit {
                Some(n) => {
                    let mut sh = Command::new("sh");
                    sh.arg("-c")
                        .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                        .arg(flexq_bin());
                    sh
                }
                None => Command::new(flexq_bin()),
            };
            cmd.arg("serve");
            if let Some(config) = config {
                cmd.arg("--config").arg(config);
            }
            if let Some(url) = database_url(dir).await {
                cmd.env("FLEXQ_DATABASE__URL", url);
            }
            let log = std::fs::File::create(&log_path).expect("the server's log file");
            let replica = format!("test-{}-{port}", std::process::id());
            let mut child = cmd
                .env("FLEXQ_DATABASE__REPLICA_ID", &replica)
                .env("FLEXQ_SERVER__BIND", format!("127.0.0.1:{port}"))
                .env(
                    "FLEXQ_SERVER__METRICS_BIND",
                    format!("127.0.0.1:{metrics_port}"),
                )
                .env("FLEXQ_DATABASE__DATA_DIR", dir)
                .env("FLEXQ_LIMITS__MUTATIONS_PER_MINUTE", "1000000")
                .env("FLEXQ_LIMITS__READS_PER_MINUTE", "1000000")
                .env("FLEXQ_LIMITS__MAX_PENDING_PER_PROJECT", "10000000")
                .env("FLEXQ_LOG__FILTER", "warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn flexq serve");
            let mut http = reqwest::Client::builder().timeout(Duration::from_secs(5));
            let endpoint = match tls_ca {
                Some(ca) => {
                    let pem = std::fs::read(ca).expect("the CA certificate");
                    http = http.add_root_certificate(
                        reqwest::Certificate::from_pem(&pem).expect("a PEM certificate"),
                    );
                    format!("https://127.0.0.1:{port}")
                }
                None => format!("http://127.0.0.1:{port}"),
            };
            let http = http.build().expect("an HTTP client");
            let deadline = Instant::now() + Duration::from_secs(30);
            let exited = loop {
                if let Some(status) = child.try_wait().expect("wait for flexq serve") {
                    break status;
                }
                if let Ok(r) = http.get(format!("{endpoint}/readyz")).send().await {
                    let ready = r.status().is_success();
                    let answer: Value = r.json().await.unwrap_or_default();
                    if ready && answer["replica"] == replica.as_str() {
                        return ServerProcess {
                            child,
                            endpoint,
                            metrics_endpoint: format!("http://127.0.0.1:{metrics_port}"),
                        };
                    }
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "flexq serve did not become ready in 30 s; its log:\n{}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            };
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            if !said.contains("cannot listen on") {
                panic!("flexq serve exited ({exited}) before it was ready; its log:\n{said}");
            }
        }
        panic!("flexq serve found no free port in three tries");
    }

    /// GET `path` on this server, as JSON.
    pub(crate) async fn get(&self, path: &str) -> Value {
        reqwest::get(format!("{}{path}", self.endpoint))
            .await
            .expect("get")
            .json()
            .await
            .expect("json")
    }

    /// A batch of the demo project's us-central1 queue.
    pub(crate) async fn batch(&self, id: &str) -> Value {
        self.get(&format!(
            "/v1/projects/demo/locations/us-central1/batches/{id}"
        ))
        .await
    }

    /// Batch `id` of `project` in us-central1.
    pub(crate) async fn batch_of(&self, project: &str, id: &str) -> Value {
        self.get(&format!(
            "/v1/projects/{project}/locations/us-central1/batches/{id}"
        ))
        .await
    }

    /// Reads batch `id` of `project` until `done` holds; after 20 s fails
    /// with the batch.
    pub(crate) async fn until(
        &self,
        project: &str,
        id: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        poll(Duration::from_secs(20), || self.batch_of(project, id), done)
            .await
            .unwrap_or_else(|b| panic!("{project}/{id}: {b:#}"))
    }

    /// Creates a batch with id `id`; returns the HTTP status.
    pub(crate) async fn create(&self, id: &str, body: &Value) -> u16 {
        reqwest::Client::new()
            .post(format!(
                "{}/v1/projects/demo/locations/us-central1/batches?batchId={id}",
                self.endpoint
            ))
            .json(body)
            .send()
            .await
            .expect("create")
            .status()
            .as_u16()
    }

    /// POSTs to `path` without a body; the status and the JSON answer
    /// (null when there is none).
    pub(crate) async fn post(&self, path: &str) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.endpoint))
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The text of this server's `/metrics` (its own process: its own
    /// metrics).
    pub(crate) async fn scrape(&self) -> String {
        reqwest::get(format!("{}/metrics", self.metrics_endpoint))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text")
    }

    pub(crate) fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

/// Writes a config layer giving us-central1-a's L4 pool `n` virtual nodes
/// (and every other pool none).
pub(crate) fn virtual_l4_config(path: &Path, n: u32) {
    let base = Config::load_without_env(None).expect("embedded config");
    std::fs::write(path, base.virtual_nodes_only("us-central1-a", "l4", n)).expect("config");
}

/// Reads the batch at `path` until `done` holds; after 20 s fails saying it
/// never became `what`, with the batch.
pub(crate) async fn until(
    s: &TestServer,
    path: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    poll(
        Duration::from_secs(20),
        || async { s.get(path).await.1 },
        done,
    )
    .await
    .unwrap_or_else(|b| panic!("{path} never became {what}: {b:#}"))
}

/// Reads with `read` every 25 ms until what it answers satisfies `done`:
/// that answer, or after `limit` the last one as an error (the caller
/// fails saying what it waited for). The one polling loop of the tests.
pub(crate) async fn poll<T, F: std::future::Future<Output = T>>(
    limit: Duration,
    mut read: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + limit;
    loop {
        let answer = read().await;
        if done(&answer) {
            return Ok(answer);
        }
        if Instant::now() >= deadline {
            return Err(answer);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        sweep_databases_of_removed_dirs();
    }
}

/// A self-signed certificate for 127.0.0.1 and localhost (its own CA),
/// in a directory that lives as long as the value.
pub(crate) struct Tls {
    _dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub(crate) fn self_signed() -> Tls {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("certificate");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).expect("cert");
    std::fs::write(&key, ck.key_pair.serialize_pem()).expect("key");
    Tls {
        _dir: dir,
        cert,
        key,
    }
}

/// The long polls of `kind` waiting now on `s` (`flexq_long_polls{kind}`).
pub(crate) async fn long_polls(s: &TestServer, kind: &str) -> u64 {
    let text = s.scrape().await;
    crate::metrics::value(&text, "flexq_long_polls", &[("kind", kind)])
        .unwrap_or_else(|| panic!("no flexq_long_polls{{kind={kind:?}}} in the metrics:\n{text}"))
        as u64
}

/// Until `n` long polls of `kind` wait on `s`: a waiter counted has read
/// and found nothing to answer, so whatever the test does next is what
/// wakes it (not a sleep that may end before the waiter waits). Fails
/// after 10 s.
pub(crate) async fn until_long_polls(s: &TestServer, kind: &str, n: u64) {
    if let Err(now) = poll(
        Duration::from_secs(10),
        || long_polls(s, kind),
        |now| *now == n,
    )
    .await
    {
        panic!("{now} {kind} long polls waiting, not {n}");
    }
}

/// The URL of a server's own database, wherever it runs, for a test that
/// looks at or changes what is stored directly: an in-process server's
/// ([`TestServer::database_url`]), or that of one in a process of its own
/// ([`TestServer::start_process_with`]), which keeps its SQLite file in
/// the test's directory itself (`FLEXQ_DATABASE__DATA_DIR`), not under
/// `data`.
pub(crate) async fn server_database_url(s: &TestServer) -> String {
    if s.process.is_none() {
        return s.database_url().await;
    }
    match database_url(s._dir.path()).await {
        Some(url) => url,
        None => format!("sqlite://{}", s._dir.path().join("flexq.db").display()),
    }
}

/// An engine opened on `config` as the server opens it (migrations run,
/// the config taken as given), for a test that reads its store's
/// sessions back; with the token that shuts it down.
pub(crate) async fn open_engine(config: &Config) -> (flexq::engine::Engine, CancellationToken) {
    let shutdown = CancellationToken::new();
    let engine = flexq::engine::Engine::open(
        config.clone(),
        flexq::engine::ConfigSource::Given,
        shutdown.clone(),
    )
    .await
    .expect("open");
    (engine, shutdown)
}
