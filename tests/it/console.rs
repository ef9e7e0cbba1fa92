//! The web console: its queue API (paged, in the region's order), and the
//! console itself in a real browser — Debian's Chromium, headless, driven
//! through its ChromeDriver over WebDriver (`scripts/test` installs both).
//! A screenshot of each page is kept in `target/test-artifacts/console/`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::scheduler::gpu_batch;
use crate::support::{TestServer, assert_status, flex_batch, flex_with, no_virtual_nodes, until};

const REGION: &str = "us-central1";

fn entries_url(s: &TestServer, project: &str, query: &str) -> String {
    s.url(&format!(
        "/v1/projects/{project}/regions/{REGION}/queue/entries?{query}"
    ))
}

async fn get_json(s: &TestServer, url: &str) -> (u16, Value) {
    let r = s.http.get(url).send().await.expect("get");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// Every page of a queue, following the tokens.
async fn all_pages(s: &TestServer, project: &str, size: usize) -> (Vec<Value>, usize) {
    let mut out = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let (st, page) = get_json(
            s,
            &entries_url(s, project, &format!("pageSize={size}&pageToken={token}")),
        )
        .await;
        assert_eq!(st, 200, "{page:#}");
        let entries = page["entries"].as_array().expect("entries");
        assert!(entries.len() <= size, "{} > {size}", entries.len());
        out.extend(entries.iter().cloned());
        pages += 1;
        token = page["nextPageToken"].as_str().expect("token").to_string();
        if token.is_empty() {
            return (out, pages);
        }
        assert!(pages < 100, "the pages never end");
    }
}

#[tokio::test]
async fn the_queue_pages_in_the_regions_order_with_each_batchs_place_and_reasons() {
    let s = TestServer::start_with(no_virtual_nodes).await;
    // Two projects, 60 batches each: fair share with equal (no) usage puts
    // project "alpha" first, then "demo".
    for (project, n) in [("demo", 60), ("alpha", 60)] {
        for i in 0..n {
            let r = s
                .http
                .post(s.url(&format!(
                    "/v1/projects/{project}/locations/{REGION}/batches?batchId={project}-{i:03}"
                )))
                .json(&flex_batch())
                .send()
                .await
                .expect("create");
            assert_eq!(r.status().as_u16(), 200);
        }
    }
    // The core learns of creates through the change stream on PostgreSQL.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (all, pages) = loop {
        let (all, pages) = all_pages(&s, "-", 20).await;
        if all.len() == 120 || Instant::now() > deadline {
            break (all, pages);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(all.len(), 120);
    assert_eq!(pages, 6, "120 entries, 20 a page");
    let positions: Vec<u64> = all
        .iter()
        .map(|e| e["queuePosition"].as_u64().expect("position"))
        .collect();
    assert_eq!(positions, (1..=120).collect::<Vec<u64>>());
    let names: Vec<&str> = all
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    assert!(names[0].ends_with("/batches/alpha-000"), "{names:?}");
    assert!(names[60].ends_with("/batches/demo-000"), "{names:?}");
    let first = &all[0];
    assert_eq!(first["project"], "alpha");
    assert_eq!(first["gpus"], 3);
    assert_eq!(first["accelerator"], "l4");
    assert!(
        first["shape"]
            .as_str()
            .expect("shape")
            .contains("2 executors of l4"),
        "{first:#}"
    );
    assert!(first["allocationDeadline"].is_string(), "{first:#}");
    assert!(
        !first["notAdmittedReasons"]
            .as_array()
            .expect("reasons")
            .is_empty(),
        "{first:#}"
    );
    // A page says what a get of the batch says.
    for e in [&all[0], &all[61], &all[119]] {
        let (_, b) = s
            .get(
                &e["name"]
                    .as_str()
                    .expect("name")
                    .replacen("projects", "/v1/projects", 1),
            )
            .await;
        assert_eq!(b["flexq"]["queuePosition"], e["queuePosition"], "{b:#}");
        assert_eq!(b["flexq"]["notAdmittedReasons"], e["notAdmittedReasons"]);
    }

    // One project's page: its batches, with their places in the region.
    let (demo, _) = all_pages(&s, "demo", 50).await;
    assert_eq!(demo.len(), 60);
    assert!(demo.iter().all(|e| e["project"] == "demo"));
    assert_eq!(demo[0]["queuePosition"], 61);
    let (_, page) = get_json(&s, &entries_url(&s, "demo", "")).await;
    assert_eq!(page["totalSize"], 60);

    // Sizes: more than 100 is lowered; bad ones are named.
    let (st, page) = get_json(&s, &entries_url(&s, "-", "pageSize=100000")).await;
    assert_eq!(st, 200);
    assert_eq!(page["entries"].as_array().expect("entries").len(), 100);
    for bad in ["-1", "lots"] {
        let (st, body) = get_json(&s, &entries_url(&s, "-", &format!("pageSize={bad}"))).await;
        assert_status(st, &body, 400, "INVALID_ARGUMENT");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("page_size") && message.contains(bad),
            "{message}"
        );
    }
    // A token of another queue, or none of ours, is refused by name.
    let (_, page) = get_json(&s, &entries_url(&s, "demo", "pageSize=5")).await;
    let token = page["nextPageToken"].as_str().expect("token");
    assert!(!token.is_empty());
    for (project, token) in [("alpha", token), ("-", "bm90LWEtdG9rZW4")] {
        let (st, body) =
            get_json(&s, &entries_url(&s, project, &format!("pageToken={token}"))).await;
        assert_status(st, &body, 400, "INVALID_ARGUMENT");
        assert!(
            body["error"]["message"]
                .as_str()
                .expect("message")
                .contains("page_token"),
            "{body:#}"
        );
    }
    let (st, body) = get_json(
        &s,
        &s.url("/v1/projects/demo/regions/nowhere/queue/entries"),
    )
    .await;
    assert_status(st, &body, 404, "NOT_FOUND");
    // Every region's stream is every project's: not one project's.
    let (st, body) = get_json(&s, &s.url("/v1/projects/demo/locations/-/batches:watch")).await;
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("region"),
        "{body:#}"
    );

    // Admins' view of every project's quotas lists both.
    let (st, q) = get_json(
        &s,
        &s.url(&format!("/v1/projects/-/regions/{REGION}/quotas")),
    )
    .await;
    assert_eq!(st, 200, "{q:#}");
    let projects: Vec<&str> = q["projects"]
        .as_array()
        .expect("projects")
        .iter()
        .map(|p| p["project"].as_str().expect("project"))
        .collect();
    assert!(
        projects.contains(&"alpha") && projects.contains(&"demo"),
        "{q:#}"
    );
    // And "-" is not a project whose limit can be set.
    let r = s
        .http
        .patch(s.url(&format!("/v1/projects/-/regions/{REGION}/quotas")))
        .json(&json!({"metric": "NVIDIA_L4_GPUS", "limit": 8}))
        .send()
        .await
        .expect("patch");
    let st = r.status().as_u16();
    let body: Value = r.json().await.expect("json");
    assert_status(st, &body, 400, "INVALID_ARGUMENT");
}

#[tokio::test]
async fn the_console_files_are_served_from_the_binary_with_their_headers() {
    let s = TestServer::start().await;
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = no_redirects
        .get(s.url("/console"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 308);
    // Relative, so that a path prefix in front of flexq stays.
    assert_eq!(r.headers()["location"], "console/");
    let r = s.http.get(s.url("/console/")).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("text/html")
    );
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .expect("csp")
            .contains("script-src 'self'")
    );
    let etag = r.headers()["etag"].clone();
    let page = r.text().await.expect("text");
    // Nothing from elsewhere, and no address from the root.
    for absolute in ["http://", "https://", "src=\"/", "href=\"/"] {
        assert!(!page.contains(absolute), "{absolute} in {page}");
    }
    let r = s
        .http
        .get(s.url("/console/"))
        .header("if-none-match", etag)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 304);
    let r = s
        .http
        .get(s.url("/console/app.js"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("text/javascript")
    );
    let (st, body) = s.get("/console/secrets.txt").await;
    assert_status(st, &body, 404, "NOT_FOUND");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("app.js")
    );
}

// ------------------------------------------------------------ the browser

/// Debian's Chromium, headless, through a ChromeDriver of its own.
struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

const WAIT: Duration = Duration::from_secs(20);

impl Browser {
    async fn open() -> Browser {
        // The WebDriver client's TLS (unused: the driver is plain HTTP on
        // loopback) needs a process-wide provider; flexq's is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
            l.local_addr().expect("addr").port()
        };
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/test installs Debian's chromium-driver)");
        let profile = tempfile::tempdir().expect("profile");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking", "--disable-sync",
                "--window-size=1300,900",
                format!("--user-data-dir={}", profile.path().display()),
            ]}),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + WAIT;
        let client = loop {
            match ClientBuilder::rustls()
                .expect("rustls")
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("chromedriver on {url}: {e}"),
            }
        };
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Opens `url` and records the page's uncaught errors and unhandled
    /// promise rejections from then on (checked by [`Self::close`]).
    async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("goto");
        self.js("if (!window.flexqErrors) { window.flexqErrors = []; \
             addEventListener('error', e => flexqErrors.push(String(e.message))); \
             addEventListener('unhandledrejection', e => flexqErrors.push(String(e.reason))); } \
             return true")
            .await;
    }

    async fn element(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
    }

    /// The text of `css` once it contains `want`.
    async fn text_with(&self, css: &str, want: &str) -> String {
        let deadline = Instant::now() + WAIT;
        let mut last = String::from("(no such element)");
        while Instant::now() < deadline {
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                if let Ok(t) = e.text().await {
                    if t.contains(want) {
                        return t;
                    }
                    last = t;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css} never showed {want:?}; it shows {last:?}");
    }

    /// Types `token` into the sign-in form and sends it.
    async fn sign_in(&self, token: &str) {
        self.element("#signin-token")
            .await
            .send_keys(token)
            .await
            .expect("keys");
        self.element("#signin button")
            .await
            .click()
            .await
            .expect("click");
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.expect("script")
    }

    /// Marks the page's window: the mark survives anything but a reload.
    async fn mark(&self) {
        self.js("window.flexqTestMark = 'kept'; return true").await;
    }

    async fn assert_not_reloaded(&self) {
        assert_eq!(
            self.js("return window.flexqTestMark ?? null").await,
            json!("kept"),
            "the page was reloaded"
        );
    }

    /// Saves a screenshot as a test artifact.
    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts/console");
        std::fs::create_dir_all(&dir).expect("artifact dir");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("screenshot file");
    }

    /// Ends the session; fails the test if the page met an error it did
    /// not handle.
    async fn close(mut self) {
        let errors = self.js("return window.flexqErrors ?? []").await;
        assert_eq!(errors, json!([]), "the console's script failed");
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

#[tokio::test]
async fn a_queued_batch_shows_why_and_a_cancel_and_the_next_allocation_show_live() {
    // The default config: two virtual L4 nodes of 4 GPUs in us-central1-a.
    let s = TestServer::start_with(|_| {}).await;
    let (st, body) = s.create("batchId=first", &flex_batch()).await;
    assert_eq!(st, 200, "{body:#}");
    let path = |id: &str| format!("/v1/projects/demo/locations/{REGION}/batches/{id}");
    until(&s, &path("first"), "first allocated", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await;
    // 8 GPUs in one zone; 5 are free.
    let (st, body) = s
        .create(
            "batchId=second",
            &flex_with("spark.executor.instances", "7"),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");

    let b = Browser::open().await;
    let console = s.url("/console/");
    b.goto(&format!("{console}#/queue?region={REGION}")).await;
    let row = b
        .text_with("tr[data-batch='second']", "has room for 5")
        .await;
    assert!(row.contains("8 l4"), "{row}");
    b.text_with("#queue-range", "1–1 of 1").await;
    // An admin may narrow the queue to a project with work in the region.
    let options = b
        .js("return [...document.querySelectorAll('#project option')].map(o => o.value)")
        .await;
    assert_eq!(options, json!(["-", "demo"]));
    b.shot("queue").await;

    b.goto(&format!("{console}#/capacity")).await;
    b.element("#capacity .node").await;
    let allocated = b
        .js("return document.querySelectorAll('#capacity .cells .gpu.allocated').length")
        .await;
    assert_eq!(allocated, json!(3));
    let free = b
        .js("return document.querySelectorAll('#capacity .cells .gpu.free').length")
        .await;
    assert_eq!(free, json!(5));
    b.shot("capacity").await;

    // The queued batch's page, in this window.
    b.goto(&format!("{console}#/batch/demo/{REGION}/second"))
        .await;
    b.text_with("#reasons", "has room for 5").await;
    b.text_with("#batch-state", "PENDING").await;
    b.element("#nodes-none").await;
    b.mark().await;
    b.shot("batch-queued").await;
    let queued_window = b.client.window().await.expect("window");

    // The running one's, in another: Cancel (and confirm).
    let other = b.client.new_window(true).await.expect("new window");
    b.client
        .switch_to_window(other.handle)
        .await
        .expect("switch");
    b.goto(&format!("{console}#/batch/demo/{REGION}/first"))
        .await;
    b.mark().await;
    b.element("#cancel").await.click().await.expect("click");
    b.text_with("#cancel", "again").await;
    b.element("#cancel").await.click().await.expect("click");
    b.text_with("#batch-state", "CANCELLED").await;
    b.text_with("#end-reason", "CANCELLED").await;
    b.text_with("#timeline", "CANCELLED").await;
    b.assert_not_reloaded().await;
    assert!(
        b.client.find(Locator::Css("#cancel")).await.is_err(),
        "a cancelled batch offers Cancel"
    );
    b.shot("batch-cancelled").await;

    // Back to the queued one: its allocation arrived without a reload.
    b.client
        .switch_to_window(queued_window)
        .await
        .expect("switch");
    let nodes = b.text_with("#nodes", "executor 6").await;
    b.assert_not_reloaded().await;
    let (_, second) = s.get(&path("second")).await;
    assert_eq!(
        second["flexq"]["provisioningState"], "PROVISIONED",
        "{second:#}"
    );
    for part in second["flexq"]["nodes"].as_array().expect("nodes") {
        assert!(
            nodes.contains(part["node"].as_str().expect("node")),
            "{nodes}"
        );
    }
    assert!(b.client.find(Locator::Css("#reasons")).await.is_err());
    b.shot("batch-allocated").await;

    b.goto(&format!("{console}#/quotas?region={REGION}")).await;
    b.text_with(
        "tr[data-project='demo'][data-metric='PREEMPTIBLE_NVIDIA_L4_GPUS']",
        "8 / 24",
    )
    .await;
    b.shot("quotas").await;
    b.goto(&format!("{console}#/usage?region={REGION}")).await;
    let usage = b.text_with("#usage tr[data-project='demo']", "l4").await;
    assert!(usage.contains("demo"), "{usage}");
    b.shot("usage").await;

    // The capacity page follows every region on one stream (an admin's
    // `-` project and region): a cancel elsewhere frees its GPUs on it.
    b.goto(&format!("{console}#/capacity")).await;
    b.element("#live.on").await;
    b.mark().await;
    s.cancel(&second).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let allocated = b
            .js("return document.querySelectorAll('#capacity .cells .gpu.allocated').length")
            .await;
        if allocated == json!(0) {
            break;
        }
        assert!(Instant::now() < deadline, "still {allocated} allocated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.assert_not_reloaded().await;
    b.close().await;
}

const BOB: &str = "token-bob";

#[tokio::test]
async fn the_console_signs_in_with_a_token_and_shows_what_its_principal_may_see() {
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.principals = [
            (
                "bob@example.com",
                "submitter",
                vec!["demo".to_string()],
                BOB,
            ),
            ("root@example.com", "admin", vec![], "token-root"),
        ]
        .into_iter()
        .map(
            |(name, role, projects, token)| flexq::config::PrincipalConfig {
                name: name.into(),
                role: serde_json::from_value(json!(role)).expect("role"),
                projects,
                node: None,
                token_sha256: flexq::engine::token_hash(token),
            },
        )
        .collect();
    })
    .await;
    let r = s
        .http
        .post(format!("{}?batchId=waiting", s.batches()))
        .bearer_auth(BOB)
        .json(&flex_batch())
        .send()
        .await
        .expect("create");
    assert_eq!(r.status().as_u16(), 200);

    let b = Browser::open().await;
    let console = s.url("/console/");
    b.goto(&format!("{console}#/queue")).await;
    // A wrong token is refused by the server, and said so.
    b.sign_in("not-a-token").await;
    b.text_with("#signin-why", "not valid").await;
    b.sign_in(BOB).await;
    b.text_with("#principal", "bob@example.com (submitter)")
        .await;
    // With no node anywhere, the page starts on the first region by name;
    // the region picker moves it.
    b.text_with("h1", "Queue of asia-southeast1").await;
    b.element("#region")
        .await
        .select_by_value(REGION)
        .await
        .expect("select");
    b.text_with("h1", &format!("Queue of {REGION}")).await;
    b.text_with("tr[data-batch='waiting']", "demo").await;
    // A submitter's queue is its projects', not every project's.
    let options = b
        .js("return [...document.querySelectorAll('#project option')].map(o => o.value)")
        .await;
    assert_eq!(options, json!(["demo"]));
    // The token is kept for the tab's session only.
    assert_eq!(b.js("return localStorage.length").await, json!(0));
    assert_eq!(
        b.js("return sessionStorage.getItem('flexq.token')").await,
        json!(BOB)
    );
    b.shot("signed-in-queue").await;
    // Its own batch can be cancelled from its page.
    b.element("tr[data-batch='waiting'] a")
        .await
        .click()
        .await
        .expect("click");
    b.element("#cancel").await;
    b.element("#signout").await.click().await.expect("click");
    b.element("#signin-token").await;
    assert_eq!(
        b.js("return sessionStorage.getItem('flexq.token')").await,
        Value::Null
    );
    b.shot("signin").await;
    b.close().await;
}

/// A reverse proxy serving flexq under `/flexq/`, streaming both ways (as
/// nginx or an ingress would).
async fn prefix_proxy(upstream: String) -> std::net::SocketAddr {
    use axum::body::Body;
    use axum::extract::{Request, State};
    use axum::response::{IntoResponse, Response};
    async fn forward(State(upstream): State<String>, req: Request) -> Response {
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let Some(rest) = path.strip_prefix("/flexq") else {
            return (axum::http::StatusCode::NOT_FOUND, "not under /flexq").into_response();
        };
        // A proxy passes redirects on; it does not follow them.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let mut out = client.request(req.method().clone(), format!("{upstream}{rest}"));
        for (k, v) in req.headers() {
            if k != axum::http::header::HOST {
                out = out.header(k, v);
            }
        }
        let body = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .expect("body");
        let resp = match out.body(body).send().await {
            Ok(r) => r,
            Err(e) => return (axum::http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
        };
        let mut builder = Response::builder().status(resp.status());
        for (k, v) in resp.headers() {
            builder = builder.header(k, v);
        }
        builder
            .body(Body::from_stream(resp.bytes_stream()))
            .expect("response")
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().fallback(forward).with_state(upstream);
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn the_console_works_live_behind_a_path_prefix() {
    let s = TestServer::start().await;
    let (st, _) = s.create("batchId=early", &flex_batch()).await;
    assert_eq!(st, 200);
    let proxy = prefix_proxy(format!("http://{}", s.addr)).await;

    let b = Browser::open().await;
    // Without the slash: the console's relative redirect keeps the prefix.
    b.goto(&format!("http://{proxy}/flexq/console")).await;
    b.element("#capacity").await;
    b.goto(&format!(
        "http://{proxy}/flexq/console/#/queue?region={REGION}"
    ))
    .await;
    b.element("tr[data-batch='early']").await;
    b.mark().await;
    // A batch created now appears through the proxied event stream.
    let (st, _) = s.create("batchId=later", &flex_batch()).await;
    assert_eq!(st, 200);
    let row = b.text_with("tr[data-batch='later']", "demo").await;
    assert!(row.starts_with('2'), "{row}");
    b.assert_not_reloaded().await;
    let url = b.client.current_url().await.expect("url");
    assert!(url.path().starts_with("/flexq/console/"), "{url}");
    b.shot("behind-a-prefix").await;

    // A long queue comes 50 rows a page, never whole.
    for i in 0..58 {
        let (st, _) = s
            .create(&format!("batchId=more-{i:02}"), &flex_batch())
            .await;
        assert_eq!(st, 200);
    }
    b.text_with("#queue-range", "1–50 of 60").await;
    let rows = b
        .js("return document.querySelectorAll('#queue tbody tr').length")
        .await;
    assert_eq!(rows, json!(50));
    b.element("#queue-next").await.click().await.expect("next");
    b.text_with("#queue-range", "51–60 of 60").await;
    let first = b.text_with("#queue tbody tr", "demo").await;
    assert!(first.starts_with("51"), "{first}");
    let rows = b
        .js("return document.querySelectorAll('#queue tbody tr').length")
        .await;
    assert_eq!(rows, json!(10));
    b.element("#queue-prev")
        .await
        .click()
        .await
        .expect("previous");
    b.text_with("#queue-range", "1–50 of 60").await;
    b.assert_not_reloaded().await;
    b.close().await;
}

/// Registers the FAKE agent's node gpu-host-1 (8 L4s in us-central1-b);
/// answers its epoch.
async fn register_gpu_host(s: &TestServer) -> String {
    let node = json!({
        "nodeId": "gpu-host-1", "region": REGION, "zone": "us-central1-b", "pool": "l4",
        "gpuAddresses": (0..8).map(|i| i.to_string()).collect::<Vec<_>>(),
        "cores": 96, "memoryMb": 393216, "localSsdGb": 3000
    });
    let (st, reg) = s.post_json("/v1/nodes:register", &node).await;
    assert_eq!(st, 200, "{reg:#}");
    reg["epoch"].as_str().expect("epoch").to_string()
}

/// Polls gpu-host-1's assignments until it has a driver; answers its
/// batch's uuid.
async fn driver_assigned(s: &TestServer, epoch: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, answer) = s
            .post_json(
                "/v1/nodes/gpu-host-1:poll",
                &json!({"epoch": epoch, "version": "", "waitFor": "1s"}),
            )
            .await;
        let driver = answer["assignments"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["role"] == "driver").cloned());
        if let Some(d) = driver {
            return d["uuid"].as_str().expect("uuid").to_string();
        }
        assert!(Instant::now() < deadline, "no assignment: {answer:#}");
    }
}

#[tokio::test]
async fn a_running_batchs_driver_output_and_end_arrive_on_its_page_live() {
    // Capacity from an agent that this test plays over the agent protocol
    // (a fake agent: no Spark, no GPU): it registers, takes the driver's
    // part, reports it started and uploads what the driver "prints".
    let s = TestServer::start_for_agents(Duration::from_secs(30)).await;
    let epoch = register_gpu_host(&s).await;
    let (st, _) = s
        .create("batchId=talks", &flex_with("spark.executor.instances", "4"))
        .await;
    assert_eq!(st, 200);
    let uuid = driver_assigned(&s, &epoch).await;
    let report = |event: Value| {
        let mut body = event;
        body["epoch"] = json!(epoch);
        body["uuid"] = json!(uuid);
        body
    };
    for event in [
        json!({"event": "MASTER_READY", "masterUrl": "spark://127.0.0.1:7077"}),
        json!({"event": "DRIVER_STARTED", "rapids": "enabled (/opt/rapids.jar)"}),
    ] {
        let (st, body) = s
            .post_json("/v1/nodes/gpu-host-1:report", &report(event))
            .await;
        assert_eq!(st, 200, "{body:#}");
    }

    let b = Browser::open().await;
    b.goto(&s.url(&format!("/console/#/batch/demo/{REGION}/talks")))
        .await;
    b.text_with("#batch-state", "RUNNING").await;
    b.text_with("#output-note", "No driver output yet").await;
    b.mark().await;
    let upload = |offset: usize, data: &str| json!({"epoch": epoch, "uuid": uuid, "offset": offset.to_string(), "data": data});
    let first = "stage 1 of 2 done\n";
    let (st, _) = s
        .post_json("/v1/nodes/gpu-host-1:output", &upload(0, first))
        .await;
    assert_eq!(st, 200);
    b.text_with("#output", "stage 1 of 2 done").await;
    // What the driver prints is shown as text, never as markup.
    let second = "<b>rows</b>: 42\n";
    let (st, _) = s
        .post_json("/v1/nodes/gpu-host-1:output", &upload(first.len(), second))
        .await;
    assert_eq!(st, 200);
    b.text_with("#output", "<b>rows</b>: 42").await;
    assert_eq!(
        b.js("return document.querySelectorAll('#output b').length")
            .await,
        json!(0)
    );
    // What its GPUs do arrives with no event (the page asks while the
    // batch runs): four points of its 5 GPUs, in three 10 s slots.
    let now = chrono::Utc::now().timestamp();
    let base = now - now.rem_euclid(10) - 40;
    let at = |s: i64| {
        chrono::DateTime::from_timestamp(base + s, 0)
            .expect("time")
            .to_rfc3339()
    };
    let points: Vec<Value> = [(5, 60.0), (10, 70.0), (15, 60.0), (20, 70.0)]
        .iter()
        .map(|(t, u)| {
            json!({"time": at(*t), "seconds": 5.0, "gpus": 5, "utilizationPercent": u,
                   "maxUtilizationPercent": u + 10.0, "maxMemoryUsedMb": 10_240})
        })
        .collect();
    let (st, taken) = s
        .post_json(
            "/v1/nodes/gpu-host-1:telemetry",
            &json!({"epoch": epoch, "batches": [{"uuid": uuid, "points": points}]}),
        )
        .await;
    assert_eq!((st, &taken["taken"]), (200, &json!(4)), "{taken:#}");
    b.text_with(
        "#gpu-summary",
        "mean 65.0 %, p95 75 %, peak memory 10.0 GiB",
    )
    .await;
    let d = b
        .js("return document.querySelector('#gpu-chart path.mean').getAttribute('d')")
        .await;
    let d = d.as_str().unwrap_or_default();
    // One unbroken line (one move) over three slots (three levels).
    assert_eq!(
        (d.matches('M').count(), d.matches('H').count()),
        (1, 3),
        "{d}"
    );
    // What the RAPIDS Accelerator could not run on the GPU, as the
    // driver's agent reports it; its reasons are text, never markup.
    let (st, body) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &report(
                json!({"event": "CPU_FALLBACK", "fallback": {"operators": 2, "reasons": [
                    "<SortExec>: not all expressions can be replaced",
                    "<Percentile>: GPU does not currently support the operator class Percentile"
                ]}}),
            ),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    b.text_with("#cpu-fallback", "2 operators could not run on the GPU")
        .await;
    b.text_with(
        "#gpus ul.reasons",
        "<SortExec>: not all expressions can be replaced",
    )
    .await;
    b.js("document.querySelector('#gpus').scrollIntoView()")
        .await;
    b.shot("batch-gpus").await;
    b.js("window.scrollTo(0, 0)").await;
    b.shot("batch-running").await;
    let (st, _) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &report(json!({"event": "FINISHED", "succeeded": true, "message": "The driver finished successfully (exit status 0).", "exitCode": 0})),
        )
        .await;
    assert_eq!(st, 200);
    b.text_with("#batch-state", "SUCCEEDED").await;
    b.text_with("#output-note", "complete").await;
    b.text_with("#timeline", "SUCCEEDED").await;
    b.assert_not_reloaded().await;
    b.shot("batch-succeeded").await;
    b.close().await;
}

#[tokio::test]
async fn a_batch_on_a_placement_alternative_names_it_and_the_queue_shows_each_alternatives() {
    // One L4 node of 4 GPUs, one A100-40 node of 8; L4 batches may take
    // A100s after 1s.
    let s = TestServer::start_with(crate::alternatives::l4_and_a100).await;
    let path = |id: &str| format!("/v1/projects/demo/locations/{REGION}/batches/{id}");
    let provisioned = |b: &Value| b["flexq"]["provisioningState"] == "PROVISIONED";
    // Fills the L4 node: a driver and 3 executors.
    let (st, body) = s.create("batchId=fill", &gpu_batch(3, "3600s")).await;
    assert_eq!(st, 200, "{body:#}");
    until(&s, &path("fill"), "fill provisioned", provisioned).await;
    let (st, body) = s.create("batchId=moves", &gpu_batch(2, "3600s")).await;
    assert_eq!(st, 200, "{body:#}");
    let moved = until(&s, &path("moves"), "moves provisioned", provisioned).await;
    assert_eq!(moved["flexq"]["placement"]["alternative"], 1, "{moved:#}");
    // Its own alternatives, whose one alternative is not tried for 50 minutes.
    let mut waits = gpu_batch(2, "3600s");
    waits["runtimeConfig"]["properties"]["spark.flexq.alternatives"] = json!("a100-40 after 50m");
    let (st, body) = s.create("batchId=waits", &waits).await;
    assert_eq!(st, 200, "{body:#}");
    // Its queue entry carries the alternatives (the core learns of a create
    // through the change stream on PostgreSQL).
    let deadline = Instant::now() + WAIT;
    let entry = loop {
        let (_, page) = get_json(&s, &entries_url(&s, "demo", "")).await;
        let found = page["entries"].as_array().and_then(|a| {
            a.iter()
                .find(|e| e["name"].as_str().is_some_and(|n| n.ends_with("/waits")))
                .cloned()
        });
        if let Some(e) = found {
            break e;
        }
        assert!(Instant::now() < deadline, "waits is not queued: {page:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        entry["alternatives"],
        json!(["a100-40 after 50m"]),
        "{entry:#}"
    );

    let b = Browser::open().await;
    let console = s.url("/console/");
    // The batch on its alternative says which, on what, where and how.
    b.goto(&format!("{console}#/batch/demo/{REGION}/moves"))
        .await;
    b.text_with("#placement-badge", "on alternative 1: a100-40")
        .await;
    let placement = b.text_with("#placement", REGION).await;
    assert!(
        placement.contains("executors of a100-40 (12 cores"),
        "{placement}"
    );
    // Another GPU type is a loan: whose, and that they may take it back.
    b.text_with("#placement-loan", "on loan of a100-40 in")
        .await;
    let rule = b.text_with("#alternatives", "a100-40 after 1s").await;
    assert!(rule.contains("runs here"), "{rule}");
    b.shot("batch-on-alternative").await;
    // One allocated as asked says so.
    b.goto(&format!("{console}#/batch/demo/{REGION}/fill"))
        .await;
    b.text_with("#placement", "its own").await;
    assert!(
        b.client
            .find(Locator::Css("#placement-badge"))
            .await
            .is_err(),
        "a batch on its own placement shows a rung's badge"
    );
    // A queued one lists its alternatives, and each alternative's reason.
    b.goto(&format!("{console}#/batch/demo/{REGION}/waits"))
        .await;
    b.text_with("#reasons", "alternative 1").await;
    let rule = b.text_with("#alternatives", "a100-40 after 50m").await;
    assert!(!rule.contains("runs here"), "{rule}");
    assert!(b.client.find(Locator::Css("#placement")).await.is_err());

    // The queue shows a queued batch's alternatives under its shape.
    b.goto(&format!("{console}#/queue?region={REGION}")).await;
    b.text_with(
        "tr[data-batch='waits'] .alternatives",
        "→ a100-40 after 50m",
    )
    .await;
    b.shot("queue-alternatives").await;
    b.close().await;
}

#[tokio::test]
async fn a_preempted_batch_shows_it_on_its_page_and_in_the_queue() {
    // Two L4 nodes of 4 GPUs; preemption by priority, no minimum runtime.
    let s = TestServer::start_with(crate::preemption::preempting).await;
    let path = |id: &str| format!("/v1/projects/demo/locations/{REGION}/batches/{id}");
    let provisioned = |b: &Value| b["flexq"]["provisioningState"] == "PROVISIONED";
    for id in ["first", "second"] {
        let (st, body) = s
            .create(&format!("batchId={id}"), &gpu_batch(2, "3600s"))
            .await;
        assert_eq!(st, 200, "{body:#}");
        until(&s, &path(id), "provisioned", provisioned).await;
    }
    let mut urgent = gpu_batch(2, "3600s");
    urgent["labels"] = json!({"flexq-priority": "10"});
    let (st, body) = s.create("batchId=urgent", &urgent).await;
    assert_eq!(st, 200, "{body:#}");
    until(&s, &path("urgent"), "provisioned", provisioned).await;
    // The victim waits again, its preemption counted.
    let second = until(&s, &path("second"), "queued again", |b| {
        b["flexq"]["provisioningState"] == "QUEUED"
    })
    .await;
    assert_eq!(second["flexq"]["preemptions"], 1, "{second:#}");

    let b = Browser::open().await;
    let console = s.url("/console/");
    b.goto(&format!("{console}#/batch/demo/{REGION}/second"))
        .await;
    b.text_with("#preemptions", "1").await;
    b.text_with("#timeline", "PREEMPTED by urgent (priority 10 > 0)")
        .await;
    b.shot("batch-preempted").await;
    b.goto(&format!("{console}#/queue?region={REGION}")).await;
    b.text_with("tr[data-batch='second'] .preempted", "preempted ×1")
        .await;
    b.close().await;
}

#[tokio::test]
async fn an_elastic_batchs_executors_grow_and_shrink_on_its_chart_live() {
    // A FAKE agent (no Spark, no GPU) plays the driver's node: it reports
    // Spark's executor demand and an idle extra, as the real one does.
    let s = TestServer::start_for_agents(Duration::from_secs(60)).await;
    let epoch = register_gpu_host(&s).await;
    let mut batch = flex_with("spark.executor.instances", "2");
    let props = &mut batch["runtimeConfig"]["properties"];
    props["spark.dynamicAllocation.enabled"] = json!("true");
    props["spark.dynamicAllocation.minExecutors"] = json!("2");
    props["spark.dynamicAllocation.maxExecutors"] = json!("4");
    let (st, _) = s.create("batchId=grows", &batch).await;
    assert_eq!(st, 200);
    let uuid = driver_assigned(&s, &epoch).await;
    let report = |event: Value| {
        let mut body = event;
        body["epoch"] = json!(epoch);
        body["uuid"] = json!(uuid);
        body
    };

    let b = Browser::open().await;
    b.goto(&s.url(&format!("/console/#/batch/demo/{REGION}/grows")))
        .await;
    b.text_with(
        "#elastic-summary",
        "2 in the core gang, 0 extras of at most 2",
    )
    .await;
    b.mark().await;
    // Spark wants 4 executors: the 2 extras are granted, and the page
    // shows them without a reload.
    let (st, body) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &report(json!({"event": "EXECUTOR_DEMAND", "targetExecutors": 4})),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    b.text_with("#elastic-summary", "2 extras of at most 2")
        .await;
    b.text_with("#executor-caption", "at most 4 (2 extras)")
        .await;
    // Steps of the line: 2 executors, then 4 (the grants may land in one
    // pass or two, so 2 or 3 levels), and the band under it.
    let levels = |d: &str| d.matches('H').count();
    let d = b
        .js("return document.querySelector('#executor-chart path.executors').getAttribute('d')")
        .await;
    let d = d.as_str().unwrap_or_default().to_string();
    assert!((2..=3).contains(&levels(&d)), "{d}");
    // The extra of executor index 2 goes idle: it goes back, live.
    let (st, body) = s
        .post_json(
            "/v1/nodes/gpu-host-1:report",
            &report(json!({"event": "EXTRA_IDLE", "index": 2})),
        )
        .await;
    assert_eq!(st, 200, "{body:#}");
    b.text_with("#elastic-summary", "1 extra of at most 2")
        .await;
    b.text_with("#executor-caption", &format!("{} changes", levels(&d) + 1))
        .await;
    let after = b
        .js("return document.querySelector('#executor-chart path.executors').getAttribute('d')")
        .await;
    let after = after.as_str().unwrap_or_default().to_string();
    assert_eq!(levels(&after), levels(&d) + 1, "one more step: {after}");
    // The same points through the API.
    let (st, chart) = get_json(
        &s,
        &s.url(&format!(
            "/v1/projects/demo/locations/{REGION}/batches/grows/executors"
        )),
    )
    .await;
    assert_eq!(st, 200, "{chart:#}");
    let last = chart["points"]
        .as_array()
        .and_then(|p| p.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&last["executors"], &last["extras"]),
        (&json!(3), &json!(1)),
        "{chart:#}"
    );
    b.assert_not_reloaded().await;
    b.js("document.querySelector('#elastic').scrollIntoView()")
        .await;
    b.shot("batch-elastic").await;
    b.close().await;
}
