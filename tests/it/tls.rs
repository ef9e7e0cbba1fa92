//! The optional HTTPS listener: served with a configured certificate,
//! verified by the CLI and the agent against a private CA, refused
//! without it.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{TestServer, fake_gpu_script, flexq_bin, self_signed, spawn_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_is_served_and_verified_by_the_cli_and_the_agent() {
    let tls = self_signed();
    let s = TestServer::start_https(&tls, |_| {}).await;
    let base = format!("https://127.0.0.1:{}", s.addr.port());
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&tls.cert).expect("pem")).expect("ca");
    let trusted = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .expect("client");
    let r = trusted
        .get(format!("{base}/v1/runtimes"))
        .send()
        .await
        .expect("https");
    assert_eq!(r.status(), 200);

    // Not trusted without the CA; no plain HTTP on the TLS port.
    let err = reqwest::get(format!("{base}/v1/runtimes"))
        .await
        .expect_err("unverified");
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );
    let plain = reqwest::get(format!("http://127.0.0.1:{}/v1/runtimes", s.addr.port())).await;
    assert!(
        plain.map(|r| r.status() != 200).unwrap_or(true),
        "plain HTTP is not served on the HTTPS listener"
    );

    // The CLI verifies it with --ca-cert, and refuses it without.
    let cli = |ca: Option<&std::path::Path>| {
        let mut cmd = Command::new(flexq_bin());
        cmd.args(["regions", "list", "--endpoint", &base])
            .env_remove("FLEXQ_CA_CERT");
        if let Some(ca) = ca {
            cmd.arg("--ca-cert").arg(ca);
        }
        cmd.output().expect("run flexq")
    };
    let ok = tokio::task::block_in_place(|| cli(Some(&tls.cert)));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("REGION"),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let refused = tokio::task::block_in_place(|| cli(None));
    assert!(!refused.status.success());

    // The agent registers over HTTPS with its ca_file.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server = \"{base}\"\nca_file = \"{}\"\nnode_id = \"tls-node\"\nregion = \"us-central1\"\nzone = \"us-central1-b\"\npool = \"l4\"\ncores = 8\nmemory_mb = 65536\nlocal_ssd_gb = 375\ngpu_discovery_script = \"{}\"\nwork_dir = \"{}\"\nlauncher = \"kubernetes\"\n",
            tls.cert.display(),
            fake_gpu_script(dir.path()).display(),
            dir.path().join("work").display()
        ),
    )
    .expect("config");
    let mut agent = spawn_agent(&config, &dir.path().join("agent.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let nodes: serde_json::Value = trusted
            .get(format!("{base}/v1/nodes"))
            .send()
            .await
            .expect("nodes")
            .json()
            .await
            .expect("json");
        if nodes["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["id"] == "tls-node"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not register over HTTPS"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
}

/// A TLS handshake that never completes, from a client that connects and
/// says nothing or sends half a ClientHello and stalls, is closed within
/// `server.header_read_timeout`, counted as a handshake timeout, and
/// holds up no other client. A server in its own process: its counters
/// move for this test alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_that_never_completes_is_closed_in_time() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const FIRST: Duration = Duration::from_secs(1);
    let tls = self_signed();
    let (cert, key) = (tls.cert.clone(), tls.key.clone());
    let s = TestServer::start_process_with(move |c| {
        crate::support::no_virtual_nodes(c);
        c.server.tls_cert = Some(cert);
        c.server.tls_key = Some(key);
        c.server.header_read_timeout = FIRST;
    })
    .await;
    let timeouts = |text: &str| {
        crate::metrics::value(
            text,
            "flexq_connections_timed_out_total",
            &[("listener", "api"), ("timeout", "handshake")],
        )
        .unwrap_or(0.0)
    };
    let before = timeouts(&s.scrape().await);

    // Three say nothing; three send a TLS record header that promises a
    // 512-byte handshake message, and one byte of it.
    let mut stalled = Vec::new();
    for i in 0..6 {
        let mut c = tokio::net::TcpStream::connect(s.addr)
            .await
            .expect("connect");
        if i % 2 == 1 {
            c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
                .await
                .expect("half a hello");
        }
        stalled.push(c);
    }
    let opened = Instant::now();

    // Meanwhile a real client is served at once.
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&tls.cert).expect("pem")).expect("ca");
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .timeout(FIRST)
        .build()
        .expect("client");
    let r = client
        .get(format!("https://127.0.0.1:{}/v1/runtimes", s.addr.port()))
        .send()
        .await
        .expect("served while handshakes stall");
    assert_eq!(r.status(), 200);

    // Each stalled connection is closed by the server (end of stream or a
    // reset), within the bound and some slack, not before most of it.
    for (i, mut c) in stalled.into_iter().enumerate() {
        let mut buf = [0u8; 1024];
        let read = tokio::time::timeout(FIRST + Duration::from_secs(3), c.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "stalled handshake {i} was not closed within {:?}: {read:?}",
            FIRST + Duration::from_secs(3)
        );
    }
    let closed = opened.elapsed();
    assert!(
        closed >= FIRST - Duration::from_millis(200),
        "closed after {closed:?}, before the bound of {FIRST:?}"
    );
    let t = Instant::now();
    loop {
        let after = timeouts(&s.scrape().await);
        if after - before == 6.0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "handshake timeouts counted: {}, expected 6",
            after - before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
