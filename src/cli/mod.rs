//! The command line's subcommands, each with its clap arguments and its
//! run: the client side over the REST API ([`batches`]; [`capacity`]:
//! `regions`, `nodes`, `quotas`, `usage`; [`queues`]; [`reload`]: `config
//! diff|reload`), shaped like the batch CLI people already know, and
//! the commands that run here ([`local`]: `serve`, `agent`, `migrate`,
//! `config`, `auth`; [`simulate`]). `src/main.rs` only parses and dispatches.
//!
//! The client commands talk to the server only through the HTTP API's
//! types.

pub mod batches;
pub mod capacity;
pub mod local;
pub mod queues;
pub(crate) mod reload;
pub mod simulate;

use std::fmt;
use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{ErrorBody, Status};

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    Yaml,
}

/// Where and as whom the CLI calls.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub endpoint: String,
    pub project: String,
    pub region: String,
    /// Sent as `Authorization: Bearer` when set.
    pub token: Option<String>,
    /// A PEM CA certificate to verify an HTTPS server with (besides the
    /// system's roots).
    pub ca_cert: Option<std::path::PathBuf>,
}

/// Where the client commands call, and as whom.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// The flexq server.
    #[arg(
        long,
        global = true,
        env = "FLEXQ_ENDPOINT",
        default_value = "http://127.0.0.1:8080"
    )]
    pub endpoint: String,
    /// The project the batches belong to.
    #[arg(long, global = true, env = "FLEXQ_PROJECT")]
    pub project: Option<String>,
    /// The region (location) of the batches.
    #[arg(long, global = true, env = "FLEXQ_REGION")]
    pub region: Option<String>,
    /// The bearer token (better from the environment than the command line).
    #[arg(long, global = true, env = "FLEXQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PEM CA certificate that signed the server's (HTTPS endpoints).
    #[arg(long, global = true, env = "FLEXQ_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value = "table")]
    pub format: OutputFormat,
}

impl TargetArgs {
    /// A client for commands that need no project or region.
    pub fn admin_client(self) -> Result<Client, CliError> {
        Client::new(Endpoint {
            endpoint: self.endpoint,
            project: self.project.unwrap_or_default(),
            region: self.region.unwrap_or_default(),
            token: self.token,
            ca_cert: self.ca_cert,
        })
    }

    /// A client for commands about one project's region: both must be
    /// given.
    pub fn project_client(self) -> Result<Client, CliError> {
        let project = self.project.ok_or_else(|| {
            CliError::Usage("no project: pass --project or set FLEXQ_PROJECT".into())
        })?;
        let region = self.region.ok_or_else(|| {
            CliError::Usage("no region: pass --region or set FLEXQ_REGION".into())
        })?;
        Client::new(Endpoint {
            endpoint: self.endpoint,
            project,
            region,
            token: self.token,
            ca_cert: self.ca_cert,
        })
    }
}

/// A failed call: the server's Status, or why the server was not reached.
#[derive(Debug)]
pub enum CliError {
    Api(Status),
    Transport(String),
    Usage(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Api(s) => {
                write!(f, "ERROR: (flexq) {}: {}", s.status.name(), s.message)?;
                for v in s.field_violations() {
                    write!(f, "\n  - {}: {}", v.field, v.description)?;
                }
                Ok(())
            }
            CliError::Transport(m) => write!(f, "ERROR: (flexq) {m}"),
            CliError::Usage(m) => write!(f, "ERROR: (flexq) {m}"),
        }
    }
}

impl std::error::Error for CliError {}

/// A thin JSON client of the REST API.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    pub target: Endpoint,
}

impl Client {
    pub fn new(target: Endpoint) -> Result<Client, CliError> {
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(60));
        if let Some(path) = &target.ca_cert {
            let pem = std::fs::read(path)
                .map_err(|e| CliError::Transport(format!("--ca-cert {}: {e}", path.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| CliError::Transport(format!("--ca-cert {}: {e}", path.display())))?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder
            .build()
            .map_err(|e| CliError::Transport(format!("cannot build HTTP client: {e}")))?;
        Ok(Client { http, target })
    }

    /// `projects/{p}/locations/{r}/batches`
    pub fn batches_path(&self) -> String {
        format!(
            "/v1/projects/{}/locations/{}/batches",
            self.target.project, self.target.region
        )
    }

    /// Opens a server-sent event stream (no overall timeout: it lasts);
    /// None when the server answers otherwise.
    pub async fn open_events(&self, path_and_query: &str) -> Option<reqwest::Response> {
        let url = format!(
            "{}{}",
            self.target.endpoint.trim_end_matches('/'),
            path_and_query
        );
        let mut req = self
            .http
            .get(&url)
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(365 * 24 * 3600));
        if let Some(token) = &self.target.token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.ok()?;
        resp.status().is_success().then_some(resp)
    }

    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&B>,
    ) -> Result<T, CliError> {
        let url = format!(
            "{}{}",
            self.target.endpoint.trim_end_matches('/'),
            path_and_query
        );
        let mut req = self.http.request(method, &url);
        if let Some(token) = &self.target.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| {
            CliError::Transport(format!(
                "cannot reach flexq at {}: {e}",
                self.target.endpoint
            ))
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| CliError::Transport(format!("reading the answer of {url}: {e}")))?;
        if status.is_success() {
            serde_json::from_slice(&bytes)
                .map_err(|e| CliError::Transport(format!("unexpected answer from {url}: {e}")))
        } else {
            match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(body) => Err(CliError::Api(body.error)),
                Err(_) => Err(CliError::Transport(format!(
                    "{url} answered {status}: {}",
                    String::from_utf8_lossy(&bytes)
                        .chars()
                        .take(200)
                        .collect::<String>()
                ))),
            }
        }
    }
}

/// Prints `value` as JSON or YAML.
pub fn print_structured<T: Serialize>(value: &T, format: OutputFormat) -> Result<(), CliError> {
    let text = match format {
        OutputFormat::Yaml => {
            serde_yaml::to_string(value).map_err(|e| CliError::Transport(e.to_string()))?
        }
        _ => {
            serde_json::to_string_pretty(value).map_err(|e| CliError::Transport(e.to_string()))?
                + "\n"
        }
    };
    print!("{text}");
    Ok(())
}

/// Prints rows under a header, columns aligned.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A JSON value as a table cell: strings bare, null empty.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Table rows of `keys` read from each item.
fn rows(list: &[serde_json::Value], keys: &[&str]) -> Vec<Vec<String>> {
    list.iter()
        .map(|item| keys.iter().map(|k| cell(&item[*k])).collect())
        .collect()
}
