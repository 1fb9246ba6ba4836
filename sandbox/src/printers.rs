//! The Table columns kube-apiserver prints for built-in kinds (Deployments, ReplicaSets, Pods,
//! Services, Events), as `pkg/printers/internalversion/printers.go` defines them, and the
//! default Table CRDs are served with.
//!
//! The server always prints the wide form (`GenerateOptions{Wide: true}` in
//! `pkg/printers/storage/storage.go`): every column is sent, and kubectl hides those of
//! priority 1 unless asked for `-o wide`.

mod cells;
mod columns;

use serde_json::{Value, json};

pub use cells::human_duration;
use cells::{created_at, deployment, event, pod, replica_set, service};
pub use columns::Column;
use columns::{DEFAULT, DEPLOYMENT, EVENT, POD, REPLICA_SET, SERVICE};

/// The cells of one object, one per column.
pub type Cells = fn(&Value) -> Vec<Value>;

/// A built-in kind's printer: its columns and the cells of one object.
pub struct Printer {
    /// The columns, in order.
    pub columns: &'static [Column],
    /// The cells of one object, one per column.
    pub cells: Cells,
}

impl Printer {
    /// The printer of a built-in kind (`group`, `kind`), if the sandbox has one.
    pub fn for_kind(group: &str, kind: &str) -> Option<Printer> {
        let (columns, cells) = match (group, kind) {
            ("apps", "Deployment") => (DEPLOYMENT, deployment as Cells),
            ("apps", "ReplicaSet") => (REPLICA_SET, replica_set as Cells),
            ("", "Pod") => (POD, pod as Cells),
            ("", "Service") => (SERVICE, service as Cells),
            ("" | "events.k8s.io", "Event") => (EVENT, event as Cells),
            ("apiextensions.k8s.io", "CustomResourceDefinition") => (DEFAULT, created_at as Cells),
            _ => return None,
        };
        Some(Printer { columns, cells })
    }

    /// The Table's `columnDefinitions`.
    pub fn definitions(&self) -> Vec<Value> {
        self.columns
            .iter()
            .map(|c| {
                json!({"name": c.name, "type": c.type_, "format": c.format,
                       "description": c.description, "priority": c.priority})
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::cells::{format_labels, format_selector};
    use super::*;

    fn cells(group: &str, kind: &str, obj: Value) -> Vec<Value> {
        let printer = Printer::for_kind(group, kind).unwrap();
        let cells = (printer.cells)(&obj);
        assert_eq!(cells.len(), printer.columns.len(), "one cell per column");
        cells
    }

    #[test]
    fn a_replica_set_prints_desired_current_ready_and_its_template() {
        let rs = json!({
            "metadata": {"name": "web-5d8f", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"pod-template-hash": "5d8f", "app": "web"}},
                     "template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}},
            "status": {"replicas": 2, "readyReplicas": 1},
        });
        let cells = cells("apps", "ReplicaSet", rs);
        assert_eq!(
            cells[..4],
            [json!("web-5d8f"), json!(3), json!(2), json!(1)]
        );
        assert_eq!(
            cells[5..],
            [
                json!("app"),
                json!("nginx"),
                json!("app=web,pod-template-hash=5d8f")
            ]
        );
    }

    #[test]
    fn selectors_print_as_label_selector_strings() {
        let selector = json!({"matchLabels": {"b": "2"}, "matchExpressions": [
            {"key": "a", "operator": "NotIn", "values": ["y", "x"]},
            {"key": "c", "operator": "Exists"},
            {"key": "d", "operator": "DoesNotExist"},
        ]});
        assert_eq!(format_selector(Some(&selector)), "a notin (x,y),b=2,c,!d");
        assert_eq!(format_selector(None), "");
        assert_eq!(format_labels(None), "<none>");
    }

    #[test]
    fn a_pod_shows_init_progress_failures_and_termination() {
        let base = json!({
            "metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i1", "state": {"terminated": {"exitCode": 0}}},
                {"name": "i2", "state": {"running": {}}},
            ]},
        });
        assert_eq!(cells("", "Pod", base.clone())[2], "Init:1/2");
        let mut failed = base.clone();
        failed["status"]["initContainerStatuses"][1]["state"] =
            json!({"terminated": {"exitCode": 2}});
        assert_eq!(cells("", "Pod", failed)[2], "Init:ExitCode:2");
        let mut pulling = base.clone();
        pulling["status"]["initContainerStatuses"][1]["state"] =
            json!({"waiting": {"reason": "ErrImagePull"}});
        assert_eq!(cells("", "Pod", pulling)[2], "Init:ErrImagePull");
        let mut deleting = base;
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(cells("", "Pod", deleting)[2], "Terminating");
        let pending = json!({"metadata": {"name": "q"}, "spec": {"containers": [{"name": "c"}]},
                             "status": {"phase": "Pending"}});
        assert_eq!(
            cells("", "Pod", pending)[1..4],
            [json!("0/1"), json!("Pending"), json!("0")]
        );
    }

    #[test]
    fn an_event_without_timestamps_prints_its_event_time_and_a_count_of_one() {
        let event = json!({
            "metadata": {"name": "e"}, "type": "Normal", "reason": "Made",
            "involvedObject": {"kind": "Deployment", "name": "web", "fieldPath": "spec"},
            "message": " made \n", "eventTime": "2026-01-01T00:00:00.000000Z",
            "firstTimestamp": null, "lastTimestamp": null,
            "reportingComponent": "ctl", "reportingInstance": "", "source": {},
        });
        let cells = cells("events.k8s.io", "Event", event);
        assert_eq!(cells[0], cells[7], "Last Seen falls back to First Seen");
        assert_ne!(cells[0], "<unknown>");
        assert_eq!(
            cells[1..7],
            [
                json!("Normal"),
                json!("Made"),
                json!("deployment/web"),
                json!("spec"),
                json!("ctl"),
                json!("made")
            ]
        );
        assert_eq!(cells[8], 1);
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(3600), "60m");
        assert_eq!(human_duration(4 * 3600 + 60), "4h1m");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
    }
}
