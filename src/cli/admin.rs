//! `flexq regions list`, `flexq nodes list`, `flexq quotas list|set`.

use reqwest::Method;
use serde_json::Value;

use super::{CliError, Client, OutputFormat, print_structured, print_table};

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
