//! A leader cut off from the database (a proxy the test cuts): another
//! replica leads, the old one steps down and comes back as a follower;
//! and a clean stop (SIGTERM) hands the lease over at once.

use std::time::{Duration, Instant};

use super::{Replica, audit, config_file, gpu_batch, leader, leads_by_metrics, leads_within};
use crate::support::fresh_postgres_database;

/// A TCP proxy to PostgreSQL that the test can cut, as a network partition
/// (or a database failover) looks to the replica behind it: while cut,
/// every connection it carried is closed and new ones are dropped.
struct Proxy {
    url: String,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    async fn start(db_url: &str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    continue; // dropped: refused
                }
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect("127.0.0.1:5432").await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        let url = db_url.replacen("127.0.0.1:5432", &format!("127.0.0.1:{port}"), 1);
        assert_ne!(
            url, db_url,
            "the test PostgreSQL is expected on 127.0.0.1:5432"
        );
        Proxy { url, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_database_is_replaced_and_comes_back_as_a_follower() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = fresh_postgres_database().await;
    let url = database.url.clone();
    let config = config_file(dir.path());
    let proxy = Proxy::start(&url).await;
    let r0 = Replica::start("r0", &proxy.url, &config, dir.path()).await;
    leads_within(&r0, Duration::from_secs(10)).await;
    let others = [
        Replica::start("r1", &url, &config, dir.path()).await,
        Replica::start("r2", &url, &config, dir.path()).await,
    ];
    let http = reqwest::Client::new();
    let create = |endpoint: &str, id: &str| {
        http.post(format!(
            "{endpoint}/v1/projects/demo/locations/us-central1/batches?batchId={id}"
        ))
        .json(&gpu_batch(3, "600s"))
        .send()
    };
    // Four whole-node batches fill the four nodes; a fifth waits.
    for i in 0..5 {
        let r = create(&r0.endpoint, &format!("before-{i}"))
            .await
            .expect("create");
        assert_eq!(r.status(), 200);
    }

    proxy.set_cut(true);
    let cut = Instant::now();
    let (took, stepped_down) = {
        let (mut took, mut stepped_down) = (None, None);
        while took.is_none() || stepped_down.is_none() {
            if took.is_none() && leader(&others).await.is_some() {
                took = Some(cut.elapsed());
            }
            if stepped_down.is_none() && leads_by_metrics(&r0.metrics).await == Some(false) {
                stepped_down = Some(cut.elapsed());
            }
            assert!(
                cut.elapsed() < Duration::from_secs(10),
                "after the cut: taken over {took:?}, stepped down {stepped_down:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (took.expect("took"), stepped_down.expect("stepped down"))
    };
    eprintln!(
        "cut off: another leads after {took:?}, the old leader stepped down after {stepped_down:?}"
    );
    assert!(took < Duration::from_secs(3), "failover took {took:?}");

    // The new leader decides: cancel an allocated batch through a follower
    // and the waiting one gets its node.
    let db = sqlx::PgPool::connect(&url).await.expect("db");
    let held: String = sqlx::query_scalar(
        "select operation_id from batches where provisioning = 1 order by seq limit 1",
    )
    .fetch_one(&db)
    .await
    .expect("an allocated batch");
    let cancel = http
        .post(format!(
            "{}/v1/projects/demo/regions/us-central1/operations/{held}:cancel",
            others[1].endpoint
        ))
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancel.status(), 200);
    let t = Instant::now();
    loop {
        let queued: i64 =
            sqlx::query_scalar("select count(*) from batches where provisioning = 0 and state = 1")
                .fetch_one(&db)
                .await
                .expect("queued");
        if queued == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the waiting batch was not allocated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Back on the network, the old leader follows.
    proxy.set_cut(false);
    let t = Instant::now();
    loop {
        if let Some(z) = r0.readyz().await {
            assert_eq!(z["role"], "follower", "{z}");
            assert_ne!(z["leader"], "r0", "{z}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "r0 never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = create(&r0.endpoint, "after").await.expect("create");
    assert_eq!(r.status(), 200, "the old leader takes submits again");

    // A clean stop (SIGTERM) gives the lease up: no wait for it to lapse.
    let mut all = vec![r0];
    all.extend(others);
    let old = leader(&all).await.expect("a leader");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(all[old].child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stopped = Instant::now();
    let old = all.remove(old);
    while leader(&all).await.is_none() {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "no replica leads after the leader stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handover = stopped.elapsed();
    eprintln!("handover after SIGTERM: {handover:?}");
    drop(old);
    assert!(
        handover < Duration::from_millis(1500),
        "a clean stop handed over in {handover:?}, as slow as a lapse"
    );
    // The default config's preemptible L4 quota: 24 per project.
    assert_eq!(audit(&url, 24).await.map(|n| n >= 5), Ok(true));
}
