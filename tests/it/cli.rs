//! The `flexq` command line against a real server.

use std::process::Command;

use crate::support::{TestServer, flexq_bin};

/// Runs `flexq COMMAND [target flags] REST...` against `s`: the target
/// flags go right after the command name, before any `--` job arguments.
fn flexq(s: &TestServer, args: &[&str]) -> (bool, String, String) {
    let (command, rest) = args.split_first().expect("a command");
    let out = Command::new(flexq_bin())
        .arg(command)
        .args([
            "--endpoint",
            &s.url(""),
            "--project",
            "demo",
            "--region",
            "us-central1",
        ])
        .args(rest)
        .env_remove("FLEXQ_ENDPOINT")
        .output()
        .expect("run flexq");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_list_describe_cancel_delete_through_the_cli() {
    let s = TestServer::start().await;
    let job = tempfile::NamedTempFile::with_suffix(".py").expect("job file");
    let path = job.path().to_str().expect("utf-8 path").to_string();
    let props = "spark.dataproc.executor.resource.accelerator.type=l4,spark.dataproc.executor.compute.tier=premium,spark.dataproc.executor.disk.tier=premium,spark.executor.instances=8";
    let s2 = &s;
    let (ok, stdout, stderr) = tokio::task::block_in_place(|| {
        flexq(
            s2,
            &[
                "batches",
                "submit",
                "pyspark",
                &path,
                "--batch",
                "cli-batch",
                "--version",
                "3.0",
                "--properties",
                props,
                "--labels",
                "team=ml",
                "--ttl",
                "2h",
                "--async",
                "--",
                "--date",
                "2026-11-29",
            ],
        )
    });
    assert!(ok, "{stderr}");
    assert!(stderr.contains("Batch [cli-batch] submitted."), "{stderr}");
    assert!(
        stdout.starts_with("projects/demo/regions/us-central1/operations/"),
        "{stdout}"
    );

    let (ok, stdout, _) = tokio::task::block_in_place(|| flexq(s2, &["batches", "list"]));
    assert!(ok);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("BATCH_ID"), "{stdout}");
    assert!(
        lines[1].starts_with("cli-batch")
            && lines[1].contains("pyspark")
            && lines[1].contains("PENDING"),
        "{stdout}"
    );

    let (ok, stdout, _) =
        tokio::task::block_in_place(|| flexq(s2, &["batches", "describe", "cli-batch"]));
    assert!(ok);
    assert!(stdout.contains("state: PENDING"), "{stdout}");
    assert!(stdout.contains("ttl: 7200s"), "{stdout}");
    assert!(
        stdout.contains(&format!("mainPythonFileUri: file://{path}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("- --date"),
        "job args after -- are kept: {stdout}"
    );

    let (ok, stdout, _) =
        tokio::task::block_in_place(|| flexq(s2, &["batches", "--format", "json", "list"]));
    assert!(ok);
    let list: serde_json::Value = serde_json::from_str(&stdout).expect("json list");
    assert_eq!(list[0]["labels"]["team"], "ml");

    let (ok, _, stderr) =
        tokio::task::block_in_place(|| flexq(s2, &["batches", "delete", "cli-batch"]));
    assert!(!ok, "a pending batch cannot be deleted");
    assert!(stderr.contains("FAILED_PRECONDITION"), "{stderr}");

    let (ok, _, stderr) =
        tokio::task::block_in_place(|| flexq(s2, &["batches", "cancel", "cli-batch"]));
    assert!(ok, "{stderr}");
    assert!(stderr.contains("CANCELLED"), "{stderr}");

    let (ok, _, stderr) =
        tokio::task::block_in_place(|| flexq(s2, &["batches", "wait", "cli-batch"]));
    assert!(!ok, "wait exits non-zero for a cancelled batch");
    assert!(stderr.contains("Batch job is CANCELLED."), "{stderr}");

    let (ok, _, stderr) =
        tokio::task::block_in_place(|| flexq(s2, &["batches", "delete", "cli-batch"]));
    assert!(ok, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_submit_prints_every_violation() {
    let s = TestServer::start().await;
    let s2 = &s;
    let (ok, _, stderr) = tokio::task::block_in_place(|| {
        flexq(
            s2,
            &[
                "batches",
                "submit",
                "pyspark",
                "gs://b/job.py",
                "--version",
                "3.0",
                "--properties",
                "spark.dataproc.executor.resource.accelerator.type=h100,spark.executor.instances=1",
            ],
        )
    });
    assert!(!ok);
    assert!(
        stderr.contains("ERROR: (flexq) INVALID_ARGUMENT"),
        "{stderr}"
    );
    assert!(
        stderr.contains("runtime_config.properties[spark.executor.instances]"),
        "{stderr}"
    );
    assert!(
        stderr.contains("accepted: l4, a100-40, a100-80"),
        "{stderr}"
    );
}

#[test]
fn a_bad_config_stops_start_up_naming_the_key() {
    let out = Command::new(flexq_bin())
        .args(["config", "check"])
        .env("FLEXQ_PROVISIONING__DEFAULT_ALLOCATION_TIMEOUT", "3h")
        .output()
        .expect("run flexq");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("provisioning.default_allocation_timeout"),
        "{stderr}"
    );

    let out = Command::new(flexq_bin())
        .arg("serve")
        .env("FLEXQ_PROVISIONING__MAX_ALLOCATION_TIMEOUT", "3h")
        .output()
        .expect("run flexq");
    assert_eq!(out.status.code(), Some(2), "serve refuses to start");
    assert!(String::from_utf8_lossy(&out.stderr).contains("provisioning.max_allocation_timeout"));

    let out = Command::new(flexq_bin())
        .args(["config", "print"])
        .env("FLEXQ_PROVISIONING__DEFAULT_ALLOCATION_TIMEOUT", "45m")
        .output()
        .expect("run flexq");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("default_allocation_timeout = \"45m\""));
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = crate::support::ServerProcess::start(dir.path()).await;
    // A create in flight: its head and half its body sent, the rest held
    // back until the server has been told to stop.
    let body = serde_json::to_vec(&crate::support::flex_batch()).expect("body");
    let (first, rest) = body.split_at(body.len() / 2);
    let address = server.endpoint.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/projects/demo/locations/us-central1/batches?batchId=in-flight HTTP/1.1\r\n\
         Host: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn.write_all(first).await.expect("first half");
    // The server holds the connection (its gauge says so) before SIGTERM.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while crate::support::sample(
        &server.scrape().await,
        "flexq_connections{listener=\"api\"}",
    ) < Some(1.0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the connection was never accepted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let pid = server.child.id();
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    // Stopping has begun: the listener no longer takes connections.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&address).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "still accepting after SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    conn.write_all(rest).await.expect("the rest of the body");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.expect("read the answer");
        assert!(
            n > 0,
            "closed without an answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(conn);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "did not stop after SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // What was answered is stored.
    let server = crate::support::ServerProcess::start(dir.path()).await;
    assert_eq!(server.batch("in-flight").await["state"], "PENDING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_nodes_and_quotas_through_the_cli() {
    let s = TestServer::start_with(|_| {}).await;
    let s2 = &s;
    let (ok, out, err) = tokio::task::block_in_place(|| flexq(s2, &["regions", "list"]));
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("us-central1") && l.contains("us-central1-a") && l.contains("l4"))
        .expect("a row");
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[3..8], ["2", "2", "8", "0", "8"], "{out}");

    let (ok, out, _) = tokio::task::block_in_place(|| flexq(s2, &["nodes", "list"]));
    assert!(ok);
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("virtual (no agent, no GPU)"))
            .count(),
        2,
        "{out}"
    );

    let (ok, out, _) = tokio::task::block_in_place(|| {
        flexq(s2, &["quotas", "set", "PREEMPTIBLE_NVIDIA_L4_GPUS", "48"])
    });
    assert!(ok);
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["PREEMPTIBLE_NVIDIA_L4_GPUS", "48", "0"]),
        "{out}"
    );
    let (ok, out, _) =
        tokio::task::block_in_place(|| flexq(s2, &["quotas", "list", "--format", "json"]));
    assert!(ok);
    let list: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(
        list.as_array()
            .expect("list")
            .iter()
            .any(|q| q["metric"] == "PREEMPTIBLE_NVIDIA_L4_GPUS" && q["limit"] == 48)
    );
    let (ok, _, err) = tokio::task::block_in_place(|| flexq(s2, &["quotas", "set", "H100", "1"]));
    assert!(!ok);
    assert!(err.contains("is not a quota metric"), "{err}");
}

#[tokio::test]
async fn json_logs_trace_a_batch_by_its_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = std::fs::File::create(dir.path().join("log.jsonl")).expect("log file");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mport = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut child = Command::new(flexq_bin())
        .arg("serve")
        .env("FLEXQ_SERVER__BIND", format!("127.0.0.1:{port}"))
        .env("FLEXQ_SERVER__METRICS_BIND", format!("127.0.0.1:{mport}"))
        .env("FLEXQ_DATABASE__DATA_DIR", dir.path())
        .env("FLEXQ_LOG__FORMAT", "json")
        .env_remove("RUST_LOG")
        .stderr(log)
        .spawn()
        .expect("serve");
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let t = std::time::Instant::now();
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let url = format!("{base}/v1/projects/demo/locations/us-central1/batches");
    let r = http
        .post(format!("{url}?batchId=traced-1"))
        .json(&crate::support::flex_batch())
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200);
    let b: serde_json::Value = http
        .get(format!("{url}/traced-1"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let op = b["operation"].as_str().expect("op");
    assert_eq!(
        http.post(format!("{base}/v1/{op}:cancel"))
            .send()
            .await
            .expect("cancel")
            .status(),
        200
    );
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();

    let text = std::fs::read_to_string(dir.path().join("log.jsonl")).expect("log");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    let traced: Vec<&str> = lines
        .iter()
        .filter(|l| l["batch.id"] == "traced-1")
        .map(|l| l["message"].as_str().unwrap_or_default())
        .collect();
    for step in [
        "batch created",
        "batch allocated",
        "batch state changed",
        "batch cancel requested",
    ] {
        assert!(
            traced.contains(&step),
            "{step:?} missing from the batch's trace {traced:?}"
        );
    }
}

/// `flexq batches wait` streams the driver's output as an agent uploads it
/// (the agent is played over HTTP here; the real one is in spark.rs) and
/// exits non-zero with the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_streams_the_driver_output_and_the_end() {
    use serde_json::{Value, json};
    let s = TestServer::start_for_agents(std::time::Duration::from_secs(60)).await;
    let post = |path: String, body: Value| {
        let http = s.http.clone();
        let url = s.url(&path);
        async move {
            let r = http.post(url).json(&body).send().await.expect("post");
            assert!(
                r.status().is_success(),
                "{path}: {}",
                r.text().await.unwrap_or_default()
            );
            r.json::<Value>().await.expect("json")
        }
    };
    let reg = post(
        "/v1/nodes:register".into(),
        json!({"nodeId": "n1", "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
               "gpuAddresses": ["0", "1"], "cores": 96, "memoryMb": 393216, "localSsdGb": 3000}),
    )
    .await;
    let epoch = reg["epoch"].as_str().expect("epoch").to_string();
    let (st, _) = s
        .create(
            "batchId=streamed",
            &json!({"pysparkBatch": {"mainPythonFileUri": "file:///jobs/x.py"},
                    "runtimeConfig": {"version": "3.0", "properties": {
                        "spark.dataproc.executor.resource.accelerator.type": "l4",
                        "spark.dataproc.executor.compute.tier": "premium",
                        "spark.dataproc.executor.disk.tier": "premium"}}}),
        )
        .await;
    assert_eq!(st, 200);
    let uuid = loop {
        let (_, b) = s
            .get("/v1/projects/demo/locations/us-central1/batches/streamed")
            .await;
        if b["flexq"]["provisioningState"] == "PROVISIONED" {
            break b["uuid"].as_str().expect("uuid").to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let report = |body: Value| {
        let mut b = body;
        b["epoch"] = json!(epoch);
        b["uuid"] = json!(uuid);
        post("/v1/nodes/n1:report".into(), b)
    };
    report(json!({"event": "DRIVER_STARTED", "rapids": "enabled (/opt/rapids.jar)"})).await;
    let output = |offset: usize, data: &str| {
        post(
            "/v1/nodes/n1:output".into(),
            json!({"epoch": epoch, "uuid": uuid, "offset": offset.to_string(), "data": data}),
        )
    };
    output(0, "first line\n").await;
    let mut wait = tokio::process::Command::new(flexq_bin())
        .args([
            "batches",
            "--endpoint",
            &s.url(""),
            "--project",
            "demo",
            "--region",
            "us-central1",
            "wait",
            "streamed",
        ])
        .env_remove("FLEXQ_ENDPOINT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run flexq");
    let mut stdout = wait.stdout.take().expect("stdout");
    let stderr = wait.stderr.take().expect("stderr");
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let mut stderr = stderr;
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    // What `wait` printed, read until it ends with `want`; fails after 10 s.
    let mut printed = String::new();
    let mut read_until = async |want: &str| {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        while !printed.ends_with(want) {
            match tokio::time::timeout_at(
                deadline,
                tokio::io::AsyncReadExt::read(&mut stdout, &mut buf),
            )
            .await
            {
                Ok(Ok(n)) if n > 0 => printed.push_str(&String::from_utf8_lossy(&buf[..n])),
                Ok(_) => panic!("wait's output ended with {printed:?}, before {want:?}"),
                Err(_) => panic!("wait printed {printed:?} in 10 s, not {want:?}"),
            }
        }
        printed.clone()
    };
    // The chunk uploaded so far is printed while the batch runs...
    assert_eq!(read_until("first line\n").await, "first line\n");
    // ... and the next one as it is uploaded, still before the end: wait
    // reads it with a long poll, so the upload is what wakes it.
    crate::support::until_long_polls(&s, "output", 1).await;
    output(11, "second line\n").await;
    assert_eq!(
        read_until("second line\n").await,
        "first line\nsecond line\n"
    );
    let (_, b) = s
        .get("/v1/projects/demo/locations/us-central1/batches/streamed")
        .await;
    assert_eq!(b["state"], "RUNNING", "both chunks printed before the end");
    report(
        json!({"event": "FINISHED", "succeeded": false, "exitCode": 1,
                  "message": "The driver failed (exit status 1): ValueError: boom"}),
    )
    .await;
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), wait.wait())
        .await
        .expect("wait ends with the batch")
        .expect("wait's status");
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut rest)
        .await
        .expect("stdout");
    let stderr = stderr.await.expect("stderr");
    assert_eq!(rest, "", "nothing more after the end: {stderr}");
    assert!(!status.success(), "a failed batch exits non-zero");
    assert!(
        stderr.contains("is RUNNING: The driver started on node n1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("FAILED. Detail: The driver failed (exit status 1): ValueError: boom"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_hold_list_resume_through_the_cli() {
    let s = TestServer::start().await;
    let run = |args: &[&str]| tokio::task::block_in_place(|| flexq(&s, args));
    let (ok, out, err) = run(&["queues", "hold", "--all-projects"]);
    assert!(ok, "{err}");
    assert!(out.contains("us-central1") && out.contains("true"), "{out}");
    // Every held queue, then this project's (held by the region's hold).
    let (ok, out, err) = run(&["queues", "list", "--format", "json"]);
    assert!(ok, "{err}");
    let one: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(one[0]["held"], true, "{out}");
    assert_eq!(one[0]["regionWide"], true, "{out}");
    assert_eq!(one[0]["project"], "demo", "{out}");
    let (ok, out, err) = run(&["queues", "resume", "--all-projects", "--format", "json"]);
    assert!(ok, "{err}");
    let resumed: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(resumed[0]["held"], false, "{out}");
    // A region flexq does not serve is named, by the server.
    let out = Command::new(flexq_bin())
        .args(["queues", "hold", "--endpoint", &s.url("")])
        .args(["--project", "demo", "--region", "mars-north1"])
        .env_remove("FLEXQ_ENDPOINT")
        .output()
        .expect("run flexq");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("mars-north1") && err.contains("NOT_FOUND"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_hears_a_change_on_the_event_stream_at_once() {
    // A server process of its own: its metrics are its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let s = crate::support::ServerProcess::start(dir.path()).await;
    assert_eq!(
        s.create("waited-on", &crate::support::flex_batch()).await,
        200
    );
    // `wait` follows the queued batch; it is cancelled from elsewhere.
    let waiter = std::process::Command::new(flexq_bin())
        .args(["batches", "wait", "waited-on"])
        .args([
            "--endpoint",
            &s.endpoint,
            "--project",
            "demo",
            "--region",
            "us-central1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("flexq batches wait");
    // It watches the batch's event stream.
    let t = std::time::Instant::now();
    while !s.scrape().await.contains("flexq_watchers 1") {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "wait never watched"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let b = s.batch("waited-on").await;
    let op = b["operation"].as_str().expect("op").to_string();
    let cancelled = std::time::Instant::now();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/{op}:cancel", s.endpoint))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 200);
    let out = tokio::task::block_in_place(|| waiter.wait_with_output()).expect("wait ends");
    let heard = cancelled.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("Batch job is CANCELLED."), "{stderr}");
    // Polling every 2 s would take up to 2 s; the stream, a fraction.
    assert!(
        heard < std::time::Duration::from_millis(1500),
        "wait heard the cancel after {heard:?}"
    );
}

/// `flexq agent --gpu-check`: on a FAKE `nvidia-smi`, and NVML loaded from
/// a library that is not there (so that reader cannot open, and says why,
/// on a machine with an NVIDIA driver too), it prints each GPU and the
/// point a part holding them would send, with the GPUs discovery lists, and
/// exits 0; with no reader that works (nor discovery) it exits 1.
#[test]
fn the_gpu_check_reads_through_each_reader_and_says_which_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = dir.path().join("nvidia-smi");
    std::fs::write(
        &fake,
        "#!/bin/sh\n# FAKE nvidia-smi (no hardware)\nif [ \"$1\" = -L ]; then\n  printf 'GPU 0: NVIDIA L4 (UUID: GPU-a)\\nGPU 1: NVIDIA L4 (UUID: GPU-b)\\n'\n  exit 0\nfi\nprintf '0, 30, 100\\n1, 90, 300\\n'\n",
    )
    .expect("fake");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let no_nvml = dir.path().join("no-such-libnvidia-ml.so.1");
    let out = Command::new(flexq_bin())
        .args(["agent", "--gpu-check", "1", "--nvidia-smi"])
        .arg(&fake)
        .arg("--nvml-library")
        .arg(&no_nvml)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("-L found GPUs [\"0\", \"1\"]"), "{text}");
    assert!(text.contains("NVML: cannot open"), "{text}");
    assert!(text.contains("no-such-libnvidia-ml.so.1"), "{text}");
    assert!(
        text.contains("GPU 1: utilization 90 % memory used 300 MiB"),
        "{text}"
    );
    assert!(text.contains("\"utilizationPercent\":60.0"), "{text}");
    let out = Command::new(flexq_bin())
        .args([
            "agent",
            "--gpu-check",
            "1",
            "--nvidia-smi",
            "/nonexistent/nvidia-smi",
        ])
        .arg("--nvml-library")
        .arg(&no_nvml)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
