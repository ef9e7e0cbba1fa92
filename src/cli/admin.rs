//! `flexq regions list`, `flexq nodes list`, `flexq quotas list|set`.

use reqwest::Method;
use serde_json::Value;

use super::{CliError, Client, OutputFormat, TargetArgs, print_structured, print_table};

/// `flexq regions list`, `flexq nodes list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: ListAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum ListAction {
    /// List them.
    List,
}

/// `flexq quotas list|set`.
#[derive(Debug, clap::Args)]
pub struct QuotasArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: QuotasAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum QuotasAction {
    /// List limit and usage of every metric.
    List,
    /// Set one limit (admin). A lowered limit never revokes running work.
    Set {
        /// e.g. PREEMPTIBLE_NVIDIA_L4_GPUS
        metric: String,
        limit: u64,
    },
}

/// `flexq regions list`.
pub async fn run_regions(args: ListArgs) -> Result<(), CliError> {
    let ListAction::List = args.action;
    let format = args.target.format;
    regions(&args.target.admin_client()?, format).await
}

/// `flexq nodes list`.
pub async fn run_nodes(args: ListArgs) -> Result<(), CliError> {
    let ListAction::List = args.action;
    let format = args.target.format;
    nodes(&args.target.admin_client()?, format).await
}

/// `flexq quotas list|set`.
pub async fn run_quotas(args: QuotasArgs) -> Result<(), CliError> {
    let format = args.target.format;
    let client = args.target.project_client()?;
    match args.action {
        QuotasAction::List => quotas(&client, format).await,
        QuotasAction::Set { metric, limit } => set_quota(&client, &metric, limit, format).await,
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn rows(list: &[Value], keys: &[&str]) -> Vec<Vec<String>> {
    list.iter()
        .map(|item| keys.iter().map(|k| cell(&item[*k])).collect())
        .collect()
}

/// Capacity per region, zone and GPU type: total, allocated, free.
pub async fn regions(client: &Client, format: OutputFormat) -> Result<(), CliError> {
    let v: Value = client
        .call::<(), _>(Method::GET, "/v1/regions", None)
        .await?;
    let list = v["capacity"].as_array().cloned().unwrap_or_default();
    if format != OutputFormat::Table {
        return print_structured(&list, format);
    }
    print_table(
        &[
            "REGION",
            "ZONE",
            "ACCELERATOR",
            "NODES",
            "VIRTUAL",
            "GPUS",
            "ALLOCATED",
            "FREE",
            "FREE_SSD_GB",
        ],
        &rows(
            &list,
            &[
                "region",
                "zone",
                "accelerator",
                "nodes",
                "virtualNodes",
                "totalGpus",
                "allocatedGpus",
                "freeGpus",
                "freeLocalSsdGb",
            ],
        ),
    );
    Ok(())
}

/// Every node, virtual ones marked.
pub async fn nodes(client: &Client, format: OutputFormat) -> Result<(), CliError> {
    let v: Value = client.call::<(), _>(Method::GET, "/v1/nodes", None).await?;
    let list = v["nodes"].as_array().cloned().unwrap_or_default();
    if format != OutputFormat::Table {
        return print_structured(&list, format);
    }
    let mut table = rows(
        &list,
        &[
            "id",
            "zone",
            "accelerator",
            "gpus",
            "freeGpus",
            "freeCores",
            "freeLocalSsdGb",
        ],
    );
    for (row, node) in table.iter_mut().zip(&list) {
        row.push(if node["virtual"] == true {
            "virtual (no agent, no GPU)".into()
        } else {
            "agent".into()
        });
    }
    print_table(
        &[
            "NODE",
            "ZONE",
            "ACCELERATOR",
            "GPUS",
            "FREE_GPUS",
            "FREE_CORES",
            "FREE_SSD_GB",
            "KIND",
        ],
        &table,
    );
    Ok(())
}

/// A project's quotas in a region.
pub async fn quotas(client: &Client, format: OutputFormat) -> Result<(), CliError> {
    let path = format!(
        "/v1/projects/{}/regions/{}/quotas",
        client.target.project, client.target.region
    );
    let v: Value = client.call::<(), _>(Method::GET, &path, None).await?;
    print_quotas(&v, format)
}

/// Sets one quota limit (admin).
pub async fn set_quota(
    client: &Client,
    metric: &str,
    limit: u64,
    format: OutputFormat,
) -> Result<(), CliError> {
    let path = format!(
        "/v1/projects/{}/regions/{}/quotas",
        client.target.project, client.target.region
    );
    let body = serde_json::json!({ "metric": metric, "limit": limit });
    let v: Value = client.call(Method::PATCH, &path, Some(&body)).await?;
    print_quotas(&v, format)
}

fn print_quotas(v: &Value, format: OutputFormat) -> Result<(), CliError> {
    let list = v["quotas"].as_array().cloned().unwrap_or_default();
    if format != OutputFormat::Table {
        return print_structured(&list, format);
    }
    print_table(
        &["METRIC", "LIMIT", "USAGE"],
        &rows(&list, &["metric", "limit", "usage"]),
    );
    Ok(())
}
