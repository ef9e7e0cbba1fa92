//! `runtimeConfig.properties`: the `spark.dataproc.*` keys flexq knows, and
//! the per-role rules (executor and driver) of docs/rules.md#properties-and-shapes that read them.

use std::collections::BTreeMap;

use super::shape::Accelerator;
use super::units::{parse_allocation_timeout, parse_memory_mb, parse_size_gb};
use super::{DYNAMIC_ALLOCATION, INITIAL_EXECUTORS, MAX_EXECUTORS_KEY, MIN_EXECUTORS};
use super::{NodeShape, ProvisioningMode, RuntimeVersion, Violations};
use super::{PartRole, Policy};
use crate::api::quote;

/// Every `spark.dataproc.*` key flexq accepts, besides the
/// `spark.dataproc.driverEnv.` prefix. Any other `spark.dataproc.*` key is
/// an error: a typo must not silently fall back to a default.
pub const DATAPROC_PROPERTIES: &[&str] = &[
    "spark.dataproc.driver.compute.tier",
    "spark.dataproc.driver.disk.size",
    "spark.dataproc.driver.disk.tier",
    "spark.dataproc.driver.provisioning.allocationTimeout",
    "spark.dataproc.driver.provisioning.mode",
    "spark.dataproc.driver.resource.accelerator.type",
    "spark.dataproc.executor.compute.tier",
    "spark.dataproc.executor.disk.size",
    "spark.dataproc.executor.disk.tier",
    "spark.dataproc.executor.provisioning.allocationTimeout",
    "spark.dataproc.executor.provisioning.mode",
    "spark.dataproc.executor.resource.accelerator.type",
    "spark.dataproc.scaling.version",
];
const DRIVER_ENV_PREFIX: &str = "spark.dataproc.driverEnv.";

/// Executors per batch, at most (a guard against absurd requests; the
/// region's capacity is the real limit).
const MAX_EXECUTORS: u32 = 1000;
/// The most `initialExecutors` may be (Dataproc's bound).
const MAX_INITIAL_EXECUTORS: u32 = 100;
/// Maximum memory per core of a CPU node, in MB (standard compute tier).
const CPU_MB_PER_CORE: u64 = 7424;
const CPU_CORES: &[u32] = &[4, 8, 16];
const MIN_MEMORY_MB: u64 = 1024;

/// The proto path of a property, as field violations name it.
pub fn property_field(key: &str) -> String {
    format!("runtime_config.properties[{key}]")
}

/// The property keys of each part of a cluster.
impl PartRole {
    fn dataproc(self, suffix: &str) -> String {
        match self {
            PartRole::Driver => format!("spark.dataproc.driver.{suffix}"),
            PartRole::Executor => format!("spark.dataproc.executor.{suffix}"),
        }
    }

    fn spark(self, suffix: &str) -> String {
        match self {
            PartRole::Driver => format!("spark.driver.{suffix}"),
            PartRole::Executor => format!("spark.executor.{suffix}"),
        }
    }

    pub(crate) fn accelerator_key(self) -> &'static str {
        match self {
            PartRole::Driver => "spark.dataproc.driver.resource.accelerator.type",
            PartRole::Executor => "spark.dataproc.executor.resource.accelerator.type",
        }
    }
}

/// The properties of one batch, trimmed.
pub(crate) struct Properties {
    map: BTreeMap<String, String>,
}

impl Properties {
    /// Trims values and checks the keys themselves: counts, sizes, unknown
    /// `spark.dataproc.*` keys.
    pub(crate) fn check(
        raw: &BTreeMap<String, String>,
        limits: &Policy,
        v: &mut Violations,
    ) -> Properties {
        if raw.len() > limits.max_properties {
            v.invalid(
                "runtime_config.properties",
                format!(
                    "{} properties given; at most {} are accepted",
                    raw.len(),
                    limits.max_properties
                ),
            );
            return Properties {
                map: BTreeMap::new(),
            };
        }
        let mut map = BTreeMap::new();
        for (key, value) in raw {
            if key.is_empty()
                || key.len() > limits.max_property_key_bytes
                || key.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                v.invalid(
                    "runtime_config.properties",
                    format!(
                        "property name {} is invalid: 1 to {} bytes, no spaces or control characters",
                        quote(key),
                        limits.max_property_key_bytes
                    ),
                );
                continue;
            }
            if value.len() > limits.max_property_value_bytes {
                v.invalid(
                    property_field(key),
                    format!(
                        "value is {} bytes; at most {} are accepted",
                        value.len(),
                        limits.max_property_value_bytes
                    ),
                );
                continue;
            }
            if key.starts_with("spark.dataproc.")
                && !key.starts_with(DRIVER_ENV_PREFIX)
                && !DATAPROC_PROPERTIES.contains(&key.as_str())
            {
                v.invalid(property_field(key), unknown_dataproc_key(key));
                continue;
            }
            map.insert(key.clone(), value.trim().to_string());
        }
        Properties { map }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    pub(crate) fn accelerator(&self, role: PartRole, v: &mut Violations) -> Option<Accelerator> {
        let key = role.accelerator_key();
        let value = self.get(key)?;
        let accel = Accelerator::parse(value);
        if accel.is_none() {
            v.invalid(
                property_field(key),
                format!(
                    "GPU type {} is not supported; accepted: {}",
                    quote(value),
                    Accelerator::accepted_names()
                ),
            );
        }
        accel
    }

    /// Runtimes before 2.2 need `LANG=C.UTF-8` in driver and executors.
    pub(crate) fn check_lang(&self, runtime: RuntimeVersion, v: &mut Violations) {
        if runtime >= RuntimeVersion::new(2, 2) {
            return;
        }
        const KEYS: [&str; 2] = ["spark.dataproc.driverEnv.LANG", "spark.executorEnv.LANG"];
        for key in KEYS {
            if self.get(key) != Some("C.UTF-8") {
                v.invalid(
                    property_field(key),
                    format!(
                        "GPU batches on runtime {runtime} need {}=C.UTF-8 and {}=C.UTF-8 (found {}={})",
                        KEYS[0],
                        KEYS[1],
                        key,
                        self.get(key).map(quote).unwrap_or_else(|| "unset".into())
                    ),
                );
            }
        }
    }

    /// The shape of the driver or of each executor.
    pub(crate) fn node_shape(
        &self,
        role: PartRole,
        accel: Option<Accelerator>,
        pyspark: bool,
        v: &mut Violations,
    ) -> NodeShape {
        self.check_tiers(role, accel, v);
        let cores = self.cores(role, accel, v);
        let gpus = accel.and_then(|a| a.gpus_for_cores(cores)).unwrap_or(0);
        let local_ssd_gb = self.local_ssd_gb(role, accel, cores, v);
        let max_total = match accel {
            Some(a) => a.max_total_memory_mb(cores).unwrap_or(0),
            None => CPU_MB_PER_CORE * u64::from(cores),
        };
        let (memory_mb, memory_overhead_mb) =
            self.memory_split(role, accel, cores, max_total, pyspark, v);
        NodeShape {
            accelerator: accel,
            cores,
            gpus,
            memory_mb,
            memory_overhead_mb,
            local_ssd_gb,
        }
    }

    /// Checks the compute and disk tiers: standard or premium, and premium
    /// for GPU executors.
    fn check_tiers(&self, role: PartRole, accel: Option<Accelerator>, v: &mut Violations) {
        for tier in ["compute.tier", "disk.tier"] {
            let key = role.dataproc(tier);
            match (self.get(&key), accel, role) {
                (Some("premium"), _, _) => {}
                // GPU work is billed at the premium tier; the executors
                // must say so explicitly (docs/rules.md#executor-shapes).
                (value, Some(a), PartRole::Executor) => v.invalid(
                    property_field(&key),
                    format!(
                        "must be \"premium\" for {a} executors (found {})",
                        value.map(quote).unwrap_or_else(|| "unset".into())
                    ),
                ),
                (Some("standard") | None, _, _) => {}
                (Some(other), _, _) => v.invalid(
                    property_field(&key),
                    format!(
                        "{} is not a tier; accepted: standard, premium",
                        quote(other)
                    ),
                ),
            }
        }
    }

    /// The cores of the driver or of each executor: one of those the
    /// accelerator (or a CPU node) accepts, else its default.
    fn cores(&self, role: PartRole, accel: Option<Accelerator>, v: &mut Violations) -> u32 {
        let cores_key = role.spark("cores");
        let (allowed, default) = match accel {
            Some(a) => (a.allowed_cores(), a.default_cores()),
            None => (CPU_CORES.to_vec(), 4),
        };
        match self.get(&cores_key) {
            None => default,
            Some(value) => match value.parse::<u32>() {
                Ok(c) if allowed.contains(&c) => c,
                _ => {
                    let shape = accel.map_or("CPU".to_string(), |a| a.to_string());
                    v.invalid(
                        property_field(&cores_key),
                        format!(
                            "{} is not a core count for the {} on {shape}; accepted: {}",
                            quote(value),
                            role.name(),
                            join(&allowed)
                        ),
                    );
                    default
                }
            },
        }
    }

    /// The local SSD of the driver or of each executor: one of the sizes a
    /// GPU node with `cores` cores offers, else its default; none on a CPU
    /// node, where a size set must still parse.
    fn local_ssd_gb(
        &self,
        role: PartRole,
        accel: Option<Accelerator>,
        cores: u32,
        v: &mut Violations,
    ) -> u64 {
        let disk_key = role.dataproc("disk.size");
        match accel {
            Some(a) => {
                let (choices, default) = a.local_ssd_choices_gb(cores);
                match self.get(&disk_key) {
                    None => default,
                    Some(value) => match parse_size_gb(value) {
                        Ok(gb) if choices.contains(&gb) => gb,
                        _ => {
                            let accepted = choices
                                .iter()
                                .map(|c| format!("{c}g"))
                                .collect::<Vec<_>>()
                                .join(", ");
                            v.invalid(
                                property_field(&disk_key),
                                format!(
                                    "{} is not a disk size of a {a} node with {cores} cores; accepted: {accepted}",
                                    quote(value)
                                ),
                            );
                            default
                        }
                    },
                }
            }
            None => {
                if let Some(value) = self.get(&disk_key) {
                    if let Err(form) = parse_size_gb(value) {
                        v.invalid(
                            property_field(&disk_key),
                            format!("{} is not {form}", quote(value)),
                        );
                    }
                }
                0
            }
        }
    }

    /// Memory and overhead: at most one may be set, each at least 1024m, the
    /// other gets what remains of the shape's maximum total.
    fn memory_split(
        &self,
        role: PartRole,
        accel: Option<Accelerator>,
        cores: u32,
        max_total: u64,
        pyspark: bool,
        v: &mut Violations,
    ) -> (u64, u64) {
        let memory_key = role.spark("memory");
        let overhead_key = role.spark("memoryOverhead");
        let default_overhead = max_total * if pyspark { 40 } else { 10 } / 100;
        let default = (max_total - default_overhead, default_overhead);
        let shape = match accel {
            Some(a) => format!("{a} with {cores} cores"),
            None => format!("a CPU node with {cores} cores"),
        };
        let parse = |key: &str, value: &str, v: &mut Violations| -> Option<u64> {
            let upper = max_total.saturating_sub(MIN_MEMORY_MB);
            match parse_memory_mb(value) {
                Ok(mb) if (MIN_MEMORY_MB..=upper).contains(&mb) => Some(mb),
                Ok(_) => {
                    v.invalid(
                        property_field(key),
                        format!(
                            "{} is out of range for {shape}: from 1024m to {upper}m (the shape's maximum total is {max_total}m, and the other part needs at least 1024m)",
                            quote(value)
                        ),
                    );
                    None
                }
                Err(form) => {
                    v.invalid(
                        property_field(key),
                        format!("{} is not {form}", quote(value)),
                    );
                    None
                }
            }
        };
        match (self.get(&memory_key), self.get(&overhead_key)) {
            (Some(_), Some(_)) => {
                v.invalid(
                    property_field(&overhead_key),
                    format!("set at most one of {memory_key} and {overhead_key}; the other gets what remains of the shape's maximum total ({max_total}m for {shape})"),
                );
                default
            }
            (Some(memory), None) => parse(&memory_key, memory, v)
                .map(|m| (m, max_total - m))
                .unwrap_or(default),
            (None, Some(overhead)) => parse(&overhead_key, overhead, v)
                .map(|o| (max_total - o, o))
                .unwrap_or(default),
            (None, None) => default,
        }
    }

    /// The cluster's executors, and whether Spark's dynamic allocation is
    /// on: with it, as many as Spark starts with, the largest of
    /// `spark.executor.instances`, `minExecutors` and `initialExecutors`,
    /// each checked against Dataproc's bounds and `minExecutors ≤
    /// initialExecutors ≤ maxExecutors`.
    pub(crate) fn executor_count(&self, v: &mut Violations) -> (u32, bool, u32) {
        let instances = self.executor_instances(v);
        match self.get(DYNAMIC_ALLOCATION) {
            None | Some("false") => return (instances, false, 0),
            Some("true") => {}
            Some(other) => {
                v.invalid(
                    property_field(DYNAMIC_ALLOCATION),
                    format!("{} is not a boolean; accepted: true or false", quote(other)),
                );
                return (instances, false, 0);
            }
        }
        let mut whole = |key: &str, default: u32, most: u32| -> Option<u32> {
            let Some(value) = self.get(key) else {
                return Some(default);
            };
            match value.trim().parse::<u32>() {
                Ok(n) if (2..=most).contains(&n) => Some(n),
                _ => {
                    v.invalid(
                        property_field(key),
                        format!(
                            "{} is not an executor count; accepted: a whole number from 2 to {most}",
                            quote(value)
                        ),
                    );
                    None
                }
            }
        };
        let min = whole(MIN_EXECUTORS, 2, MAX_EXECUTORS);
        // Spark starts from minExecutors when initialExecutors is not set.
        let initial = whole(INITIAL_EXECUTORS, min.unwrap_or(2), MAX_INITIAL_EXECUTORS);
        let max = whole(MAX_EXECUTORS_KEY, MAX_EXECUTORS, MAX_EXECUTORS);
        let (Some(min), Some(initial), Some(max)) = (min, initial, max) else {
            return (instances, true, 0);
        };
        let count = instances.max(min).max(initial);
        if min > initial {
            v.invalid(
                property_field(INITIAL_EXECUTORS),
                format!("{initial} is below {MIN_EXECUTORS} {min}; accepted: minExecutors ≤ initialExecutors ≤ maxExecutors"),
            );
        } else if count > max {
            v.invalid(
                property_field(MAX_EXECUTORS_KEY),
                format!(
                    "{max} is below the {count} executors Spark starts with (the largest of spark.executor.instances {instances}, minExecutors {min} and initialExecutors {initial}); accepted: from {count} to {MAX_EXECUTORS}"
                ),
            );
        }
        (count, true, max.saturating_sub(count))
    }

    pub(crate) fn executor_instances(&self, v: &mut Violations) -> u32 {
        const KEY: &str = "spark.executor.instances";
        match self.get(KEY) {
            None => 2,
            Some(value) => match value.parse::<u32>() {
                Ok(n) if (2..=MAX_EXECUTORS).contains(&n) => n,
                _ => {
                    v.invalid(
                        property_field(KEY),
                        format!(
                            "{} is not an executor count; accepted: a whole number from 2 to {MAX_EXECUTORS}",
                            quote(value)
                        ),
                    );
                    2
                }
            },
        }
    }

    /// Whether the batch's cluster may be preempted
    /// ([`super::PREEMPTIBLE_PROPERTY`]): `true` (the default) or `false`,
    /// where the region's preemption policy honours it.
    pub(crate) fn preemptible(&self, region: &str, policy: &Policy, v: &mut Violations) -> bool {
        let key = super::PREEMPTIBLE_PROPERTY;
        match self.get(key) {
            None | Some("true") => true,
            Some("false") => {
                if policy.preemption_opt_out.get(region) == Some(&false) {
                    v.invalid(
                        property_field(key),
                        format!(
                            "false is not allowed in {region}: its preemption policy does not let batches opt out (regions.{region}.preemption.allow_opt_out is false); accepted: true, or leave it out"
                        ),
                    );
                }
                false
            }
            Some(other) => {
                v.invalid(
                    property_field(key),
                    format!("{} is not a boolean; accepted: true or false", quote(other)),
                );
                true
            }
        }
    }

    pub(crate) fn provisioning_mode(
        &self,
        uses_gpus: bool,
        runtime: Option<RuntimeVersion>,
        v: &mut Violations,
    ) -> Option<ProvisioningMode> {
        let runtime = runtime?;
        let mut modes = Vec::new();
        for role in [PartRole::Driver, PartRole::Executor] {
            let key = role.dataproc("provisioning.mode");
            let Some(value) = self.get(&key) else {
                continue;
            };
            let mode = match value {
                "queue" => ProvisioningMode::Queue,
                "default" => ProvisioningMode::Default,
                other => {
                    v.invalid(
                        property_field(&key),
                        format!(
                            "{} is not a provisioning mode; accepted: queue, default",
                            quote(other)
                        ),
                    );
                    continue;
                }
            };
            if mode == ProvisioningMode::Queue && runtime < RuntimeVersion::new(3, 0) {
                v.invalid(
                    property_field(&key),
                    format!("\"queue\" (flex start) needs runtime 3.0 or later; this batch uses {runtime}"),
                );
            }
            modes.push((key, mode));
        }
        match modes.as_slice() {
            [] if uses_gpus && runtime >= RuntimeVersion::new(3, 0) => {
                Some(ProvisioningMode::Queue)
            }
            [] => Some(ProvisioningMode::Default),
            [(_, one)] => Some(*one),
            [(_, a), (key, b)] if a != b => {
                v.invalid(
                    property_field(key),
                    format!(
                        "driver and executors must use the same provisioning mode (the cluster is allocated as one unit); found {} and {}",
                        a.name(),
                        b.name()
                    ),
                );
                Some(*a)
            }
            [(_, a), ..] => Some(*a),
        }
    }

    /// The smaller of the two allocation timeouts, in seconds.
    pub(crate) fn allocation_timeout(&self, policy: &Policy, v: &mut Violations) -> u64 {
        let max_s = policy.max_allocation_timeout_s;
        let default_s = policy.default_allocation_timeout_s;
        [PartRole::Driver, PartRole::Executor]
            .into_iter()
            .map(|role| {
                let key = role.dataproc("provisioning.allocationTimeout");
                match self.get(&key) {
                    None => default_s,
                    Some(value) => parse_allocation_timeout(value, max_s).unwrap_or_else(|form| {
                        v.invalid(
                            property_field(&key),
                            format!(
                                "{} is not a valid allocation timeout: use {form}",
                                quote(value)
                            ),
                        );
                        default_s
                    }),
                }
            })
            .min()
            .unwrap_or(default_s)
    }
}

fn unknown_dataproc_key(key: &str) -> String {
    let nearest = DATAPROC_PROPERTIES
        .iter()
        .map(|known| (strsim::levenshtein(key, known), *known))
        .min();
    match nearest {
        Some((distance, known)) if distance <= 4 => format!(
            "unknown property {}; did you mean \"{known}\"? Unknown spark.dataproc.* properties are rejected so a typo cannot fall back to a default",
            quote(key)
        ),
        _ => format!(
            "unknown property {}; accepted spark.dataproc.* properties: {}, and spark.dataproc.driverEnv.*",
            quote(key),
            DATAPROC_PROPERTIES.join(", ")
        ),
    }
}

fn join(values: &[u32]) -> String {
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
