//! `flexq batches submit|list|describe|cancel|delete|wait`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use reqwest::Method;

use super::{CliError, Client, OutputFormat, TargetArgs, print_structured, print_table};
use crate::api::{
    Batch, EnvironmentConfig, ExecutionConfig, ListBatchesResponse, Operation, PySparkBatch,
    RuntimeConfig, SparkBatch, SparkSqlBatch, State,
};
use crate::protocol::BatchOutput;

/// The workload of a submit.
#[derive(Debug, Clone)]
pub enum SubmitWorkload {
    Pyspark {
        file: String,
        py_files: Vec<String>,
    },
    Spark {
        class: Option<String>,
        jar: Option<String>,
    },
    SparkSql {
        file: String,
    },
}

/// Everything else a submit may set.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SubmitOptions {
    /// The batch id (generated when absent).
    #[arg(long = "batch")]
    pub batch_id: Option<String>,
    /// Idempotency key: a retried submit with it returns the first batch.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Runtime version, e.g. 3.0.
    #[arg(long)]
    pub version: Option<String>,
    /// Spark properties: k=v,k=v (or ^#^k=a,b#k2=v).
    #[arg(long)]
    pub properties: Option<String>,
    /// Labels: k=v,k=v.
    #[arg(long)]
    pub labels: Option<String>,
    /// Maximum run time, e.g. 4h.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<Duration>,
    /// Extra jars (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub jars: Vec<String>,
    /// Extra files (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub files: Vec<String>,
    /// Return once the batch is submitted.
    #[arg(long = "async")]
    pub run_async: bool,
    /// Arguments for the job, after --.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// `flexq batches …`.
#[derive(Debug, clap::Args)]
pub struct BatchesArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: BatchesAction,
}

// Built once per run; its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub enum BatchesAction {
    /// Submit a batch; follows it until it ends unless --async.
    Submit {
        #[command(subcommand)]
        kind: SubmitKind,
    },
    /// List batches, newest first.
    List {
        /// AIP-160 filter, e.g. 'state = RUNNING AND create_time < "2026-01-01T00:00:00Z"'.
        #[arg(long)]
        filter: Option<String>,
        #[arg(long)]
        page_size: Option<u32>,
        /// Stop after this many batches.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Show one batch (YAML unless --format json).
    Describe { batch: String },
    /// Cancel a batch.
    Cancel { batch: String },
    /// Delete a finished batch.
    Delete { batch: String },
    /// Follow a batch until it ends; exit non-zero unless it SUCCEEDED.
    Wait { batch: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum SubmitKind {
    /// A PySpark batch.
    Pyspark {
        /// The main Python file: a local path or a URI.
        file: String,
        /// Extra Python files (comma-separated).
        #[arg(long, value_delimiter = ',')]
        py_files: Vec<String>,
        #[command(flatten)]
        opts: SubmitOptions,
    },
    /// A Spark (JVM) batch.
    Spark {
        /// The main class.
        #[arg(long, required_unless_present = "jar", conflicts_with = "jar")]
        class: Option<String>,
        /// The main jar.
        #[arg(long)]
        jar: Option<String>,
        #[command(flatten)]
        opts: SubmitOptions,
    },
    /// A Spark SQL batch.
    SparkSql {
        /// The query file: a local path or a URI.
        file: String,
        #[command(flatten)]
        opts: SubmitOptions,
    },
}

/// `flexq batches …`: exits non-zero when a followed batch did not succeed.
pub async fn run(args: BatchesArgs) -> Result<std::process::ExitCode, CliError> {
    let format = args.target.format;
    let client = args.target.project_client()?;
    let ok = match args.action {
        BatchesAction::Submit { kind } => {
            let (workload, opts) = match kind {
                SubmitKind::Pyspark {
                    file,
                    py_files,
                    opts,
                } => (SubmitWorkload::Pyspark { file, py_files }, opts),
                SubmitKind::Spark { class, jar, opts } => {
                    (SubmitWorkload::Spark { class, jar }, opts)
                }
                SubmitKind::SparkSql { file, opts } => (SubmitWorkload::SparkSql { file }, opts),
            };
            submit(&client, workload, opts).await?
        }
        BatchesAction::List {
            filter,
            page_size,
            limit,
        } => {
            list(&client, filter.as_deref(), page_size, limit, format).await?;
            true
        }
        BatchesAction::Describe { batch } => {
            describe(&client, &batch, format).await?;
            true
        }
        BatchesAction::Cancel { batch } => {
            cancel(&client, &batch).await?;
            true
        }
        BatchesAction::Delete { batch } => {
            delete(&client, &batch).await?;
            true
        }
        BatchesAction::Wait { batch } => wait(&client, &batch).await?,
    };
    Ok(if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// How often `wait` looks at the batch.
const POLL: Duration = Duration::from_secs(2);

/// Builds the Batch of a submit (pure: no I/O but reading the local
/// file's path).
pub fn build_batch(workload: &SubmitWorkload, opts: &SubmitOptions) -> Result<Batch, CliError> {
    let jars = opts
        .jars
        .iter()
        .map(|j| to_uri(j))
        .collect::<Result<Vec<_>, _>>()?;
    let files = opts
        .files
        .iter()
        .map(|f| to_uri(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut batch = Batch::default();
    match workload {
        SubmitWorkload::Pyspark { file, py_files } => {
            batch.pyspark_batch = Some(PySparkBatch {
                main_python_file_uri: to_uri(file)?,
                args: opts.args.clone(),
                python_file_uris: py_files
                    .iter()
                    .map(|f| to_uri(f))
                    .collect::<Result<_, _>>()?,
                jar_file_uris: jars,
                file_uris: files,
                ..Default::default()
            })
        }
        SubmitWorkload::Spark { class, jar } => {
            batch.spark_batch = Some(SparkBatch {
                main_class: class.clone(),
                main_jar_file_uri: jar.as_deref().map(to_uri).transpose()?,
                args: opts.args.clone(),
                jar_file_uris: jars,
                file_uris: files,
                ..Default::default()
            })
        }
        SubmitWorkload::SparkSql { file } => {
            batch.spark_sql_batch = Some(SparkSqlBatch {
                query_file_uri: to_uri(file)?,
                jar_file_uris: jars,
                ..Default::default()
            })
        }
    }
    let properties = match &opts.properties {
        Some(p) => parse_pairs(p, "--properties")?,
        None => BTreeMap::new(),
    };
    if opts.version.is_some() || !properties.is_empty() {
        batch.runtime_config = Some(RuntimeConfig {
            version: opts.version.clone(),
            properties,
            ..Default::default()
        });
    }
    if let Some(labels) = &opts.labels {
        batch.labels = parse_pairs(labels, "--labels")?;
    }
    if let Some(ttl) = opts.ttl {
        batch.environment_config = Some(EnvironmentConfig {
            execution_config: Some(ExecutionConfig {
                ttl: Some(format!("{}s", ttl.as_secs())),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    Ok(batch)
}

/// A local path becomes an absolute `file://` URI; URIs pass unchanged.
fn to_uri(path: &str) -> Result<String, CliError> {
    if path.contains("://") {
        return Ok(path.to_string());
    }
    let abs = std::fs::canonicalize(Path::new(path))
        .map_err(|e| CliError::Usage(format!("cannot use {path}: {e}")))?;
    Ok(format!("file://{}", abs.display()))
}

/// `k=v,k=v`, or with another delimiter as in `^#^k=a,b#k2=v`.
pub fn parse_pairs(text: &str, flag: &str) -> Result<BTreeMap<String, String>, CliError> {
    let (delimiter, body) = match text.strip_prefix('^') {
        Some(rest) => match rest.split_once('^') {
            Some((d, body)) if !d.is_empty() => (d.to_string(), body),
            _ => {
                return Err(CliError::Usage(format!(
                    "{flag}: a custom delimiter is written ^DELIM^k=v{{DELIM}}k=v"
                )));
            }
        },
        None => (",".to_string(), text),
    };
    let mut out = BTreeMap::new();
    for pair in body
        .split(delimiter.as_str())
        .filter(|p| !p.trim().is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("{flag}: {pair:?} is not KEY=VALUE")))?;
        out.insert(k.trim().to_string(), v.to_string());
    }
    Ok(out)
}

pub async fn submit(
    client: &Client,
    workload: SubmitWorkload,
    opts: SubmitOptions,
) -> Result<bool, CliError> {
    let batch = build_batch(&workload, &opts)?;
    let mut query = Vec::new();
    if let Some(id) = &opts.batch_id {
        query.push(("batchId", id.as_str()));
    }
    if let Some(id) = &opts.request_id {
        query.push(("requestId", id.as_str()));
    }
    let query = serde_urlencoded::to_string(&query).unwrap_or_default();
    let path = format!("{}?{query}", client.batches_path());
    let op: Operation = client.call(Method::POST, &path, Some(&batch)).await?;
    let batch_id = op
        .metadata
        .batch
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    eprintln!("Batch [{batch_id}] submitted.");
    if opts.run_async {
        println!("{}", op.name);
        return Ok(true);
    }
    wait(client, &batch_id).await
}

pub async fn get(client: &Client, batch_id: &str) -> Result<Batch, CliError> {
    client
        .call::<(), _>(
            Method::GET,
            &format!("{}/{batch_id}", client.batches_path()),
            None,
        )
        .await
}

pub async fn list(
    client: &Client,
    filter: Option<&str>,
    page_size: Option<u32>,
    limit: Option<usize>,
    format: OutputFormat,
) -> Result<(), CliError> {
    let mut batches = Vec::new();
    let mut token = String::new();
    loop {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(f) = filter {
            query.push(("filter", f.to_string()));
        }
        if let Some(n) = page_size {
            query.push(("pageSize", n.to_string()));
        }
        if !token.is_empty() {
            query.push(("pageToken", token.clone()));
        }
        let path = format!(
            "{}?{}",
            client.batches_path(),
            serde_urlencoded::to_string(&query).unwrap_or_default()
        );
        let page: ListBatchesResponse = client.call::<(), _>(Method::GET, &path, None).await?;
        batches.extend(page.batches);
        if limit.is_some_and(|l| batches.len() >= l) {
            batches.truncate(limit.unwrap_or(usize::MAX));
            break;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    match format {
        OutputFormat::Table => {
            let rows: Vec<Vec<String>> = batches
                .iter()
                .map(|b| {
                    vec![
                        b.name
                            .as_deref()
                            .and_then(|n| n.rsplit('/').next())
                            .unwrap_or_default()
                            .to_string(),
                        b.job_type().to_string(),
                        b.state.map(|s| s.to_string()).unwrap_or_default(),
                        b.create_time
                            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            print_table(&["BATCH_ID", "JOB_TYPE", "STATUS", "CREATE_TIME"], &rows);
            Ok(())
        }
        other => print_structured(&batches, other),
    }
}

pub async fn describe(
    client: &Client,
    batch_id: &str,
    format: OutputFormat,
) -> Result<(), CliError> {
    let batch = get(client, batch_id).await?;
    // describe is YAML unless asked otherwise, as people expect.
    let format = if format == OutputFormat::Table {
        OutputFormat::Yaml
    } else {
        format
    };
    print_structured(&batch, format)
}

pub async fn cancel(client: &Client, batch_id: &str) -> Result<(), CliError> {
    let batch = get(client, batch_id).await?;
    let operation = batch
        .operation
        .ok_or_else(|| CliError::Transport("the batch has no operation".into()))?;
    client
        .call::<serde_json::Value, serde_json::Value>(
            Method::POST,
            &format!("/v1/{operation}:cancel"),
            None,
        )
        .await?;
    let after = get(client, batch_id).await?;
    eprintln!(
        "Batch [{batch_id}] cancellation requested; it is now {}.",
        after.state.map(|s| s.name()).unwrap_or("UNKNOWN")
    );
    Ok(())
}

pub async fn delete(client: &Client, batch_id: &str) -> Result<(), CliError> {
    client
        .call::<(), serde_json::Value>(
            Method::DELETE,
            &format!("{}/{batch_id}", client.batches_path()),
            None,
        )
        .await?;
    eprintln!("Deleted batch [{batch_id}].");
    Ok(())
}

/// Follows a batch until it ends: prints each state change (stderr) and
/// streams the driver's output (stdout) as it comes. Ok(true) when it
/// SUCCEEDED.
pub async fn wait(client: &Client, batch_id: &str) -> Result<bool, CliError> {
    use std::io::Write;
    // Opened before the first read: a change after it is in the stream.
    let mut changes = Changes::open(client, batch_id).await;
    let mut last: Option<(State, String)> = None;
    let mut offset = 0u64;
    loop {
        let batch = get(client, batch_id).await?;
        let state = batch.state.unwrap_or(State::StateUnspecified);
        let message = batch.state_message.clone().unwrap_or_default();
        if last.as_ref() != Some(&(state, message.clone())) {
            if !state.is_terminal() {
                eprintln!("Batch [{batch_id}] is {state}: {message}");
            }
            last = Some((state, message.clone()));
        }
        let mut output_done = true;
        if batch.runtime_info.is_some() {
            // Long poll: answers with new output, at the end, or after 2s
            // (then the state is looked at again).
            let out: BatchOutput = client
                .call::<(), _>(
                    Method::GET,
                    &format!(
                        "{}/{batch_id}/output?offset={offset}&waitFor=2s",
                        client.batches_path()
                    ),
                    None,
                )
                .await?;
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(out.data.as_bytes());
            let _ = stdout.flush();
            offset = out.next_offset.parse().unwrap_or(offset);
            output_done = out.done;
            if out.done && out.truncated {
                eprintln!("(output beyond the server's limit was not kept)");
            }
        }
        match state {
            State::Succeeded if output_done => {
                eprintln!("Batch [{batch_id}] finished: SUCCEEDED. {message}");
                return Ok(true);
            }
            State::Failed | State::Cancelled if output_done => {
                eprintln!("Batch job is {state}. Detail: {message}");
                return Ok(false);
            }
            _ if batch.runtime_info.is_some() => {}
            _ => changes.next().await,
        }
    }
}

/// A batch's event stream (`batches:watch?batchId=`): `wait` reads the
/// batch again when it changes rather than every [`POLL`]. Without one
/// (an older server, a dropped stream), it polls.
struct Changes {
    stream: Option<reqwest::Response>,
    text: String,
}

impl Changes {
    async fn open(client: &Client, batch_id: &str) -> Changes {
        let path = format!("{}:watch?batchId={batch_id}", client.batches_path());
        Changes {
            stream: client.open_events(&path).await,
            text: String::new(),
        }
    }

    /// Returns once the batch changed (an event about it), or after at most
    /// 30 s; [`POLL`] when there is no stream.
    async fn next(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            tokio::time::sleep(POLL).await;
            return;
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            // Whole events end with a blank line.
            while let Some(end) = self.text.find("\n\n") {
                let event: String = self.text.drain(..end + 2).collect();
                if event
                    .lines()
                    .any(|l| l == "event: batch" || l == "event: deleted")
                {
                    return;
                }
            }
            match tokio::time::timeout_at(deadline, stream.chunk()).await {
                Err(_) => return,
                Ok(Ok(Some(bytes))) => self.text.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(_) => {
                    self.stream = None;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_split_on_commas_or_a_custom_delimiter() {
        let p = parse_pairs("a=1,b=x=y", "--properties").expect("pairs");
        assert_eq!(p["a"], "1");
        assert_eq!(p["b"], "x=y");
        let p = parse_pairs("^#^spark.jars=a.jar,b.jar#k=v", "--properties").expect("pairs");
        assert_eq!(p["spark.jars"], "a.jar,b.jar");
        assert!(parse_pairs("novalue", "--labels").is_err());
    }

    #[test]
    fn a_submit_builds_the_published_flex_start_batch() {
        let opts = SubmitOptions {
            version: Some("3.0".into()),
            properties: Some(
                "spark.dataproc.executor.resource.accelerator.type=l4,spark.executor.instances=8"
                    .into(),
            ),
            ttl: Some(Duration::from_secs(4 * 3600)),
            ..Default::default()
        };
        let b = build_batch(
            &SubmitWorkload::Pyspark {
                file: "gs://bucket/job.py".into(),
                py_files: vec![],
            },
            &opts,
        )
        .expect("batch");
        assert_eq!(b.properties()["spark.executor.instances"], "8");
        assert_eq!(
            b.environment_config
                .and_then(|e| e.execution_config)
                .and_then(|e| e.ttl),
            Some("14400s".into())
        );
    }
}
