//! The standard process series, read from `/proc` at each scrape (Linux; elsewhere none).
//!
//! The names and meanings are those of the Prometheus client libraries' process collectors, so
//! dashboards and alerts written for any exporter work unchanged: `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`. A series whose file cannot be read is left out of that scrape
//! rather than reported as 0.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

/// `/proc` reports CPU and start times in ticks of `USER_HZ`, which the kernel fixes at 100 for
/// userspace on every architecture Linux supports (the Go client's procfs assumes the same).
const USER_HZ: f64 = 100.0;

/// Reads the process series on each scrape.
#[derive(Debug)]
pub struct Collector;

/// One reading of the process series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<i64>,
    /// Open file descriptors.
    pub open_fds: Option<i64>,
    /// The soft limit on open file descriptors (none when unlimited).
    pub max_fds: Option<i64>,
    /// Start time, Unix seconds.
    pub start_time_seconds: Option<f64>,
}

impl Sample {
    /// Reads `/proc/self`.
    pub fn read() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat");
        let stat = stat.as_deref().and_then(parse_stat);
        let boot_time = read("/proc/stat").as_deref().and_then(parse_boot_time);
        Self {
            cpu_seconds: stat.map(|s| s.cpu_ticks as f64 / USER_HZ),
            resident_bytes: read("/proc/self/status").as_deref().and_then(parse_rss),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|entries| entries.count() as i64),
            max_fds: read("/proc/self/limits").as_deref().and_then(parse_max_fds),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Stat {
    cpu_ticks: u64,
    start_ticks: u64,
}

/// `utime + stime` and `starttime` of `/proc/self/stat` (fields 14, 15 and 22). The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 (state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
    })
}

fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `VmRSS` of `/proc/self/status`, in kB there: it needs no page size, unlike `stat`'s pages.
fn parse_rss(text: &str) -> Option<i64> {
    let line = text.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kib: i64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// The soft limit of the `Max open files` row of `/proc/self/limits`.
fn parse_max_fds(text: &str) -> Option<i64> {
    let row = text
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    row.split_whitespace().next()?.parse().ok()
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let sample = Sample::read();
        if let Some(v) = sample.cpu_seconds {
            let metric = ConstCounter::new(v);
            let e = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent",
                Some(&Unit::Seconds),
                metric.metric_type(),
            )?;
            metric.encode(e)?;
        }
        let gauges: [(&str, &str, Option<Unit>, Option<i64>); 3] = [
            (
                "process_resident_memory",
                "Resident memory size",
                Some(Unit::Bytes),
                sample.resident_bytes,
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                None,
                sample.open_fds,
            ),
            (
                "process_max_fds",
                "Soft limit on open file descriptors",
                None,
                sample.max_fds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            if let Some(v) = value {
                let metric = ConstGauge::new(v);
                let e =
                    encoder.encode_descriptor(name, help, unit.as_ref(), metric.metric_type())?;
                metric.encode(e)?;
            }
        }
        if let Some(v) = sample.start_time_seconds {
            let metric = ConstGauge::new(v);
            let e = encoder.encode_descriptor(
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Some(&Unit::Seconds),
                metric.metric_type(),
            )?;
            metric.encode(e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_a_command_name_with_spaces_and_parentheses() {
        let line = "4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 50 0 0 20 0 8 0 123456 10000000 2000 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 300,
                start_ticks: 123456
            })
        );
        assert_eq!(parse_stat("4242 (cut"), None);
    }

    #[test]
    fn rss_limits_and_boot_time_are_read_from_their_rows() {
        assert_eq!(
            parse_rss("Name:\tx\nVmRSS:\t   2048 kB\nVmData: 1 kB\n"),
            Some(2048 * 1024)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_fds(unlimited), None);
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_running_with_memory_and_descriptors() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let s = Sample::read();
        assert!(s.resident_bytes.unwrap() > 0, "{s:?}");
        let open = s.open_fds.unwrap();
        assert!(open >= 3, "{s:?}");
        if let Some(max) = s.max_fds {
            assert!(max >= open, "{s:?}");
        }
        assert!(s.cpu_seconds.unwrap() >= 0.0, "{s:?}");
        let start = s.start_time_seconds.unwrap();
        assert!(start <= now + 1.0 && start > now - 3600.0, "{s:?}");
    }
}
