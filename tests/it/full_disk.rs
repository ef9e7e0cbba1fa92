//! A full disk (SQLite), for real: the server's data directory is a small
//! tmpfs of its own, filled with a ballast file and then with creates.
//! Writes are refused with a clear error, reads go on, `/readyz` and
//! `/metrics` say so, and writes work again within seconds of space
//! coming back, with no restart; nothing acknowledged is lost.
//!
//! Mounting needs root, as `scripts/test` runs on these machines; without
//! it the test fails, naming why.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{TestServer, flex_with, no_virtual_nodes, sample};

/// A tmpfs of `size` mounted for the test, unmounted when dropped.
struct SmallDisk {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "cannot mount a {size} tmpfs for the full-disk test (it needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { path, _dir: dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Fills what is free on the disk of `path` with `ballast`, then frees
/// `leave` bytes of it.
fn fill(ballast: &Path, leave: u64) {
    let mut f = std::fs::File::create(ballast).expect("ballast");
    for chunk in [1 << 20, 4096, 512] {
        let buf = vec![0x5a_u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.sync_all();
    let len = f.metadata().expect("ballast size").len();
    f.set_len(len.saturating_sub(leave)).expect("free a little");
}

fn reason(body: &Value) -> String {
    body["error"]["details"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|d| d["reason"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_full_disk_refuses_writes_clearly_and_they_resume_when_space_returns() {
    let disk = SmallDisk::mount("24m");
    let data = disk.path.join("data");
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.database.data_dir = data.clone();
        c.database.url = None;
    })
    .await;
    let ballast = disk.path.join("ballast");
    fill(&ballast, 512 * 1024);

    // Creates until the disk is full.
    let body = flex_with("spark.app.name", &"p".repeat(3000));
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let refusal = loop {
        let id = format!("fill-{}", acknowledged.len());
        let (st, answer) = s.create(&format!("batchId={id}"), &body).await;
        if st != 200 {
            break (st, answer);
        }
        let op = answer["name"].as_str().expect("operation name").to_string();
        acknowledged.push((id, op));
        assert!(acknowledged.len() < 5000, "the disk never filled");
    };
    assert!(!acknowledged.is_empty(), "nothing fitted: {refusal:?}");
    let (st, err) = &refusal;
    assert_eq!(*st, 429, "{err}");
    assert_eq!(err["error"]["status"], "RESOURCE_EXHAUSTED", "{err}");
    assert_eq!(reason(err), "STORE_FULL", "{err}");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("disk is full"), "{err}");

    // Reads go on, and say the disk is full (as the last write found it).
    assert_eq!(s.list_all("").await.len(), acknowledged.len());
    let (st, ready) = s.get("/readyz").await;
    assert_eq!(st, 200, "{ready}");
    assert!(
        ready["store"]
            .as_str()
            .unwrap_or_default()
            .starts_with("full"),
        "{ready}"
    );
    // `flexq_store_full` is each server's own: 1 here, and 0 from a
    // healthy server of the same process scraped at the same moments (a
    // process-wide gauge would say one server's state in the other's
    // scrape).
    let healthy = TestServer::start_with(no_virtual_nodes).await;
    for _ in 0..20 {
        let (full, fine) = tokio::join!(s.scrape(), healthy.scrape());
        assert_eq!(
            sample(&full, "flexq_store_full"),
            Some(1.0),
            "flexq_store_full while the disk is full:\n{full}"
        );
        assert_eq!(
            sample(&fine, "flexq_store_full"),
            Some(0.0),
            "flexq_store_full of a healthy server:\n{fine}"
        );
    }
    drop(healthy);

    // Still full: a write is refused the same way (a small one may still
    // fit), never a 503: the failed commit's connection is not reused
    // inside its transaction.
    for i in 0..5 {
        let id = format!("more-{i}");
        let (st, answer) = s.create(&format!("batchId={id}"), &body).await;
        match st {
            200 => acknowledged.push((id, answer["name"].as_str().unwrap_or_default().into())),
            _ => assert_eq!(
                (st, reason(&answer)),
                (429, "STORE_FULL".into()),
                "{answer}"
            ),
        }
    }
    let (st, err) = s.post(&format!("/v1/{}:cancel", acknowledged[0].1)).await;
    assert!(
        st == 200 || (st, reason(&err)) == (429, "STORE_FULL".into()),
        "{st} {err}"
    );

    // Space comes back: writes work again within seconds, no restart.
    std::fs::remove_file(&ballast).expect("remove the ballast");
    let freed = Instant::now();
    loop {
        let (st, answer) = s.create("batchId=after-space", &body).await;
        if st == 200 {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(5),
            "writes did not resume within 5 s of space coming back: {st} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (st, answer) = s.post(&format!("/v1/{}:cancel", acknowledged[1].1)).await;
    assert_eq!(st, 200, "{answer}");
    let (_, ready) = s.get("/readyz").await;
    assert_eq!(ready["store"], "ok", "{ready}");
    assert_eq!(
        sample(&s.scrape().await, "flexq_store_full"),
        Some(0.0),
        "flexq_store_full once writes work again"
    );

    // Nothing acknowledged was lost.
    let listed: Vec<String> = s
        .list_all("")
        .await
        .iter()
        .filter_map(|b| {
            b["name"]
                .as_str()
                .map(|n| n.rsplit('/').next().unwrap_or(n).to_string())
        })
        .collect();
    for (id, _) in &acknowledged {
        assert!(listed.contains(id), "{id} was acknowledged and is gone");
    }
    drop(s);
}

/// A database of the test PostgreSQL whose tablespace lies on a disk of
/// its own; dropped, with the tablespace, when this value is.
struct DatabaseOnDisk {
    url: String,
    name: String,
    tablespace: String,
}

impl DatabaseOnDisk {
    /// PostgreSQL's server runs as its own user (`postgres`, on the same
    /// machine): the tablespace's directory is its, and on the way to it
    /// every directory lets it through.
    async fn create(disk: &SmallDisk) -> DatabaseOnDisk {
        use sqlx::{Connection, Executor};
        use std::os::unix::fs::PermissionsExt;
        let location = disk.path.join("tablespace");
        std::fs::create_dir(&location).expect("tablespace directory");
        let mut dir = Some(location.as_path());
        while let Some(d) =
            dir.filter(|d| d.starts_with(std::env::temp_dir()) && *d != std::env::temp_dir())
        {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            dir = d.parent();
        }
        let out = Command::new("chown")
            .arg("postgres:postgres")
            .arg(&location)
            .output()
            .expect("run chown");
        assert!(
            out.status.success(),
            "chown the tablespace to postgres: {out:?}"
        );
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let (name, tablespace) = (format!("flexq_t_{suffix}"), format!("flexq_ts_{suffix}"));
        let admin = crate::support::postgres_admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("PostgreSQL");
        conn.execute(
            format!(
                "create tablespace {tablespace} location '{}'",
                location.display()
            )
            .as_str(),
        )
        .await
        .expect("create the tablespace (PostgreSQL must run on this machine)");
        conn.execute(format!("create database {name} tablespace {tablespace}").as_str())
            .await
            .expect("create the database on it");
        let _ = conn.close().await;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        DatabaseOnDisk {
            url: format!("{base}/{name}"),
            name,
            tablespace,
        }
    }
}

impl Drop for DatabaseOnDisk {
    fn drop(&mut self) {
        crate::support::admin_statements(vec![
            format!("drop database if exists {} with (force)", self.name),
            format!("drop tablespace if exists {}", self.tablespace),
        ]);
    }
}

/// PostgreSQL's disk full, for real: the server's database lives in a
/// tablespace on a small tmpfs, filled with a ballast file and then with
/// creates until PostgreSQL cannot extend a file (SQLSTATE 53100).
/// Writes are refused as STORE_FULL, reads go on, `/readyz` says so, and
/// writes resume once space comes back, with no restart; nothing
/// acknowledged is lost.
#[tokio::test]
async fn postgres_out_of_disk_refuses_writes_clearly_and_they_resume_when_space_returns() {
    let disk = SmallDisk::mount("48m");
    let database = DatabaseOnDisk::create(&disk).await;
    let url = database.url.clone();
    let s = TestServer::start_with(|c| {
        no_virtual_nodes(c);
        c.database.url = Some(url);
    })
    .await;
    let ballast = disk.path.join("ballast");
    fill(&ballast, 256 * 1024);

    let body = flex_with("spark.app.name", &"p".repeat(3000));
    let mut acknowledged: Vec<String> = Vec::new();
    let (st, err) = loop {
        let id = format!("fill-{}", acknowledged.len());
        let (st, answer) = s.create(&format!("batchId={id}"), &body).await;
        if st != 200 {
            break (st, answer);
        }
        acknowledged.push(id);
        assert!(acknowledged.len() < 5000, "the disk never filled");
    };
    assert_eq!(
        (st, reason(&err)),
        (429, "STORE_FULL".into()),
        "after {} creates: {err}",
        acknowledged.len()
    );
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("disk is full")),
        "{err}"
    );
    assert_eq!(
        s.list_all("").await.len(),
        acknowledged.len(),
        "reads go on"
    );
    let (st, ready) = s.get("/readyz").await;
    assert_eq!(st, 200, "{ready}");
    assert!(
        ready["store"]
            .as_str()
            .is_some_and(|v| v.starts_with("full")),
        "{ready}"
    );

    // Past the probe's delay, readiness tries a write of its own: it must
    // need space as a create does (on PostgreSQL a write into pages the
    // database has would pass on a full disk), so it still says full.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let (_, ready) = s.get("/readyz").await;
    assert!(
        ready["store"]
            .as_str()
            .is_some_and(|v| v.starts_with("full")),
        "the probe found space on a full disk: {ready}"
    );

    // Space comes back: readiness sees it by itself, then creates work.
    std::fs::remove_file(&ballast).expect("remove the ballast");
    let freed = Instant::now();
    loop {
        let (_, ready) = s.get("/readyz").await;
        if ready["store"] == "ok" {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(8),
            "readiness did not see space come back within 8 s: {ready}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (st, answer) = s.create("batchId=after-space", &body).await;
    assert_eq!(st, 200, "{answer}");
    let listed: Vec<String> = s
        .list_all("")
        .await
        .iter()
        .filter_map(|b| Some(b["name"].as_str()?.rsplit('/').next()?.to_string()))
        .collect();
    for id in &acknowledged {
        assert!(listed.contains(id), "{id} was acknowledged and is gone");
    }
    drop(s);
    drop(database);
}
