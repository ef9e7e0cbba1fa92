//! The accelerator tables of docs/rules.md#properties-and-shapes: GPU types, their quota metrics, the
//! executor shapes each allows, GPUs per shape, local SSD sizes and the
//! maximum memory of each shape. Data, not logic: a new GPU type is a new
//! row here.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A GPU type, by its argument name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Accelerator {
    #[serde(rename = "l4")]
    L4,
    #[serde(rename = "a100-40")]
    A100_40,
    #[serde(rename = "a100-80")]
    A100_80,
}

/// One row of the accelerator table.
struct Row {
    accelerator: Accelerator,
    name: &'static str,
    on_demand_metric: QuotaMetric,
    preemptible_metric: QuotaMetric,
    default_cores: u32,
    /// (cores, GPUs, max total memory MB, fixed local SSD GB or None when
    /// the SSD is chosen from `ssd_choices_gb`)
    shapes: &'static [(u32, u32, u64, Option<u64>)],
    ssd_choices_gb: &'static [u64],
    default_ssd_gb: u64,
}

const TABLE: [Row; 3] = [
    Row {
        accelerator: Accelerator::L4,
        name: "l4",
        on_demand_metric: QuotaMetric::NvidiaL4Gpus,
        preemptible_metric: QuotaMetric::PreemptibleNvidiaL4Gpus,
        default_cores: 4,
        shapes: &[
            (4, 1, 13384, Some(375)),
            (8, 1, 26768, Some(375)),
            (12, 1, 40152, Some(375)),
            (16, 1, 53536, Some(375)),
            (24, 2, 113072, Some(750)),
            (48, 4, 160608, Some(1500)),
            (96, 8, 321216, Some(3000)),
        ],
        ssd_choices_gb: &[],
        default_ssd_gb: 375,
    },
    Row {
        accelerator: Accelerator::A100_40,
        name: "a100-40",
        on_demand_metric: QuotaMetric::NvidiaA100Gpus,
        preemptible_metric: QuotaMetric::PreemptibleNvidiaA100Gpus,
        default_cores: 12,
        shapes: &[(12, 1, 78040, None)],
        ssd_choices_gb: &[375, 750, 1500, 3000, 6000, 9000],
        default_ssd_gb: 375,
    },
    Row {
        accelerator: Accelerator::A100_80,
        name: "a100-80",
        on_demand_metric: QuotaMetric::NvidiaA100_80gbGpus,
        preemptible_metric: QuotaMetric::PreemptibleNvidiaA100_80gbGpus,
        default_cores: 12,
        shapes: &[(12, 1, 165080, None)],
        ssd_choices_gb: &[375, 750, 1500, 3000, 6000, 9000],
        default_ssd_gb: 375,
    },
];

impl Accelerator {
    pub const ALL: [Accelerator; 3] = [Accelerator::L4, Accelerator::A100_40, Accelerator::A100_80];

    fn row(self) -> &'static Row {
        TABLE
            .iter()
            .find(|r| r.accelerator == self)
            .unwrap_or(&TABLE[0])
    }

    /// The argument name (`l4`, `a100-40`, `a100-80`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    pub fn parse(value: &str) -> Option<Accelerator> {
        Accelerator::ALL.into_iter().find(|a| a.name() == value)
    }

    /// "l4, a100-40, a100-80", for error messages.
    pub fn accepted_names() -> String {
        Accelerator::ALL.map(|a| a.name()).join(", ")
    }

    /// The quota metric this GPU draws from in a provisioning mode.
    pub fn quota_metric(self, preemptible: bool) -> QuotaMetric {
        if preemptible {
            self.row().preemptible_metric
        } else {
            self.row().on_demand_metric
        }
    }

    pub fn default_cores(self) -> u32 {
        self.row().default_cores
    }

    pub fn allowed_cores(self) -> Vec<u32> {
        self.row().shapes.iter().map(|s| s.0).collect()
    }

    fn shape(self, cores: u32) -> Option<&'static (u32, u32, u64, Option<u64>)> {
        self.row().shapes.iter().find(|s| s.0 == cores)
    }

    /// GPUs on a node of this many cores (None: no such shape).
    pub fn gpus_for_cores(self, cores: u32) -> Option<u32> {
        self.shape(cores).map(|s| s.1)
    }

    /// Maximum memory + overhead, in MB, of a node of this many cores.
    pub fn max_total_memory_mb(self, cores: u32) -> Option<u64> {
        self.shape(cores).map(|s| s.2)
    }

    /// The local SSD sizes a node of this many cores may have, and the
    /// default.
    pub fn local_ssd_choices_gb(self, cores: u32) -> (Vec<u64>, u64) {
        match self.shape(cores) {
            Some((_, _, _, Some(fixed))) => (vec![*fixed], *fixed),
            _ => (
                self.row().ssd_choices_gb.to_vec(),
                self.row().default_ssd_gb,
            ),
        }
    }
}

impl fmt::Display for Accelerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Compute Engine quota metric flexq accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum QuotaMetric {
    NvidiaL4Gpus,
    PreemptibleNvidiaL4Gpus,
    NvidiaA100Gpus,
    PreemptibleNvidiaA100Gpus,
    #[serde(rename = "NVIDIA_A100_80GB_GPUS")]
    NvidiaA100_80gbGpus,
    #[serde(rename = "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS")]
    PreemptibleNvidiaA100_80gbGpus,
    LocalSsdTotalGb,
}

impl QuotaMetric {
    pub const ALL: [QuotaMetric; 7] = [
        QuotaMetric::PreemptibleNvidiaL4Gpus,
        QuotaMetric::NvidiaL4Gpus,
        QuotaMetric::PreemptibleNvidiaA100Gpus,
        QuotaMetric::NvidiaA100Gpus,
        QuotaMetric::PreemptibleNvidiaA100_80gbGpus,
        QuotaMetric::NvidiaA100_80gbGpus,
        QuotaMetric::LocalSsdTotalGb,
    ];

    pub fn parse(name: &str) -> Option<QuotaMetric> {
        QuotaMetric::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            QuotaMetric::NvidiaL4Gpus => "NVIDIA_L4_GPUS",
            QuotaMetric::PreemptibleNvidiaL4Gpus => "PREEMPTIBLE_NVIDIA_L4_GPUS",
            QuotaMetric::NvidiaA100Gpus => "NVIDIA_A100_GPUS",
            QuotaMetric::PreemptibleNvidiaA100Gpus => "PREEMPTIBLE_NVIDIA_A100_GPUS",
            QuotaMetric::NvidiaA100_80gbGpus => "NVIDIA_A100_80GB_GPUS",
            QuotaMetric::PreemptibleNvidiaA100_80gbGpus => "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS",
            QuotaMetric::LocalSsdTotalGb => "LOCAL_SSD_TOTAL_GB",
        }
    }
}

impl fmt::Display for QuotaMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l4_gpus_grow_with_the_large_shapes() {
        let gpus: Vec<_> = Accelerator::L4
            .allowed_cores()
            .into_iter()
            .map(|c| Accelerator::L4.gpus_for_cores(c))
            .collect();
        assert_eq!(
            gpus,
            [1, 1, 1, 1, 2, 4, 8].map(Some).to_vec(),
            "4..16 cores: 1 GPU; 24/48/96: 2/4/8"
        );
        assert_eq!(Accelerator::A100_80.allowed_cores(), vec![12]);
    }

    #[test]
    fn metrics_serialize_to_compute_engine_names() {
        for m in [
            QuotaMetric::PreemptibleNvidiaA100_80gbGpus,
            QuotaMetric::LocalSsdTotalGb,
            QuotaMetric::NvidiaL4Gpus,
        ] {
            assert_eq!(
                serde_json::to_value(m).expect("serializes"),
                serde_json::json!(m.name())
            );
        }
    }
}

/// A part of a cluster: the driver, or one of the executors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartRole {
    Driver,
    Executor,
}

impl PartRole {
    /// "driver" or "executor", as stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            PartRole::Driver => "driver",
            PartRole::Executor => "executor",
        }
    }
}
