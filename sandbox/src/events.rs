//! One Event store, two APIs: core `v1` and `events.k8s.io/v1` Events are views of the same
//! stored objects (kept in the core form, as kube-apiserver keeps both as its internal
//! `core.Event`), with their field conversion and their field-selector labels.
//!
//! The real rules: `pkg/apis/events/v1/conversion.go` (fields and `events.k8s.io` field labels),
//! `pkg/apis/core/v1/conversion.go` (`AddFieldLabelConversionsForEvent`),
//! `pkg/registry/core/event/strategy.go` (`ToSelectableFields`) and
//! `pkg/registry/events/rest/storage_events.go` (events.k8s.io served from core's storage).

use serde_json::{Map, Value};

/// `apiVersion` of the core form, the one Events are stored in.
pub const CORE: &str = "v1";
/// `apiVersion` of the `events.k8s.io` form.
pub const EVENTS_V1: &str = "events.k8s.io/v1";

/// Fields whose name differs between the two forms: (core, events.k8s.io). Every other field
/// (`eventTime`, `series`, `type`, `reason`, `action`, `related`, `reportingInstance`,
/// `metadata`) has the same name and shape in both.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Whether an object is an Event of one of the two APIs.
fn is_event(obj: &Value) -> bool {
    obj.get("kind").and_then(Value::as_str) == Some("Event")
        && matches!(
            obj.get("apiVersion").and_then(Value::as_str),
            Some(CORE | EVENTS_V1)
        )
}

/// Whether [`convert`] changes `obj`: an Event of one API asked for in the other.
pub fn converts(obj: &Value, api_version: &str) -> bool {
    is_event(obj)
        && matches!(api_version, CORE | EVENTS_V1)
        && obj.get("apiVersion").and_then(Value::as_str) != Some(api_version)
}

/// Converts an Event to the form of `api_version` (`v1` or `events.k8s.io/v1`), by the
/// `apiVersion` it carries; anything else (another kind, or already in that form) is left as
/// it is, so converting twice is harmless.
pub fn convert(obj: &mut Value, api_version: &str) {
    if !converts(obj, api_version) {
        return;
    }
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let to_events = api_version == EVENTS_V1;
    for (core, events) in RENAMED {
        let (old, new) = if to_events {
            (core, events)
        } else {
            (events, core)
        };
        match map.remove(*old) {
            Some(value) => {
                map.insert((*new).to_owned(), value);
            }
            None => {
                map.remove(*new);
            }
        }
    }
    map.insert("apiVersion".into(), Value::String(api_version.to_owned()));
    zero_values(map, to_events);
}

/// The fields Go's encoder writes even when they are empty (no `omitempty`, or a struct), and
/// the empty ones it leaves out, so clients see the shape kube-apiserver gives them: an empty
/// reference and source, `null` times, and the reporting strings only in the core form.
fn zero_values(map: &mut Map<String, Value>, events: bool) {
    let (objects, times, strings): (&[&str], &[&str], &[&str]) = if events {
        (
            &["regarding", "deprecatedSource"],
            &[
                "eventTime",
                "deprecatedFirstTimestamp",
                "deprecatedLastTimestamp",
            ],
            &[],
        )
    } else {
        (
            &["involvedObject", "source"],
            &["firstTimestamp", "lastTimestamp", "eventTime"],
            &["reportingComponent", "reportingInstance"],
        )
    };
    for field in objects {
        map.entry(*field)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    for field in times {
        map.entry(*field).or_insert(Value::Null);
    }
    for field in strings {
        map.entry(*field)
            .or_insert_with(|| Value::String(String::new()));
    }
    if events {
        for field in ["reportingController", "reportingInstance"] {
            if map.get(field).is_some_and(|v| v == "") {
                map.remove(field);
            }
        }
    }
}

/// The labels a field selector on Events may name, per API, and the selectable field each
/// stands for (`ToSelectableFields`' names, which are the core form's).
const CORE_LABELS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.namespace",
    "metadata.name",
];

/// Translates a field-selector label of the Events API served as `api_version` to the
/// selectable field it filters on; `field label not supported: <label>` when that API has no
/// such label (events.k8s.io knows `regarding.*`, not `involvedObject.*`, and
/// `reportingController` for `reportingComponent`).
pub fn field_label(api_version: &str, label: &str) -> Result<&'static str, String> {
    let found = if api_version == EVENTS_V1 {
        match label {
            "regarding.kind" => Some("involvedObject.kind"),
            "regarding.namespace" => Some("involvedObject.namespace"),
            "regarding.name" => Some("involvedObject.name"),
            "regarding.uid" => Some("involvedObject.uid"),
            "regarding.apiVersion" => Some("involvedObject.apiVersion"),
            "regarding.resourceVersion" => Some("involvedObject.resourceVersion"),
            "regarding.fieldPath" => Some("involvedObject.fieldPath"),
            "reportingController" => Some("reportingComponent"),
            "reason" | "source" | "type" | "metadata.namespace" | "metadata.name" => {
                CORE_LABELS.iter().copied().find(|l| *l == label)
            }
            _ => None,
        }
    } else {
        CORE_LABELS.iter().copied().find(|l| *l == label)
    };
    found.ok_or_else(|| format!("field label not supported: {label}"))
}

/// The value of a selectable field (a [`field_label`] result) of a stored (core form) Event.
/// `source` is `source.component`, or `reportingComponent` when that is empty.
pub fn selectable_field(stored: &Value, field: &str) -> String {
    let text = |pointer: &str| {
        stored
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    match field {
        "source" => {
            let component = text("/source/component");
            if component.is_empty() {
                text("/reportingComponent")
            } else {
                component
            }
        }
        other => text(&format!("/{}", other.replace('.', "/"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn core_event() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "a.1", "namespace": "ns"},
            "involvedObject": {"kind": "MyApp", "name": "a", "namespace": "ns", "uid": "u1"},
            "reason": "Created", "message": "made it", "type": "Normal", "action": "Create",
            "source": {"component": "kubelet", "host": "node-1"},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z",
            "count": 3, "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
            "reportingComponent": "myapp-operator", "reportingInstance": "pod-0",
            "related": {"kind": "Deployment", "name": "a"},
        })
    }

    #[test]
    fn a_core_event_reads_as_events_k8s_io_and_back_unchanged() {
        let mut event = core_event();
        convert(&mut event, EVENTS_V1);
        assert_eq!(event["apiVersion"], "events.k8s.io/v1");
        assert_eq!(event["regarding"]["name"], "a");
        assert_eq!(event["note"], "made it");
        assert_eq!(event["deprecatedSource"]["host"], "node-1");
        assert_eq!(event["deprecatedFirstTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(event["deprecatedLastTimestamp"], "2026-01-01T00:01:00Z");
        assert_eq!(event["deprecatedCount"], 3);
        assert_eq!(event["reportingController"], "myapp-operator");
        assert_eq!(event["reportingInstance"], "pod-0");
        assert_eq!(event["series"]["count"], 3);
        assert_eq!(event["related"]["kind"], "Deployment");
        for core_only in ["involvedObject", "message", "source", "count"] {
            assert!(event.get(core_only).is_none(), "{core_only}");
        }
        let converted = event.clone();
        convert(&mut event, EVENTS_V1);
        assert_eq!(event, converted, "converting to the same form is a no-op");
        convert(&mut event, CORE);
        assert_eq!(event, core_event());
    }

    #[test]
    fn empty_fields_are_written_as_go_writes_them() {
        let mut event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                               "metadata": {"name": "x"}, "note": "n"});
        convert(&mut event, CORE);
        assert_eq!(event["source"], json!({}));
        assert_eq!(event["involvedObject"], json!({}));
        assert_eq!(event["reportingComponent"], "");
        assert_eq!(event["firstTimestamp"], Value::Null);
        convert(&mut event, EVENTS_V1);
        assert_eq!(event["eventTime"], Value::Null);
        assert!(event.get("reportingController").is_none(), "omitempty");
        assert_eq!(event["deprecatedSource"], json!({}));
    }

    #[test]
    fn other_kinds_are_not_converted() {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "message": "m"});
        convert(&mut pod, EVENTS_V1);
        assert_eq!(pod["apiVersion"], "v1");
        assert_eq!(pod["message"], "m");
    }

    #[test]
    fn each_api_has_its_own_field_labels() {
        assert_eq!(
            field_label(EVENTS_V1, "regarding.name"),
            Ok("involvedObject.name")
        );
        assert_eq!(
            field_label(EVENTS_V1, "reportingController"),
            Ok("reportingComponent")
        );
        assert_eq!(
            field_label(EVENTS_V1, "involvedObject.name"),
            Err("field label not supported: involvedObject.name".into())
        );
        assert_eq!(
            field_label(CORE, "involvedObject.uid"),
            Ok("involvedObject.uid")
        );
        assert_eq!(
            field_label(CORE, "regarding.name"),
            Err("field label not supported: regarding.name".into())
        );
        assert_eq!(
            field_label(CORE, "message"),
            Err("field label not supported: message".into())
        );
    }

    #[test]
    fn source_falls_back_to_the_reporting_component() {
        let mut event = core_event();
        assert_eq!(selectable_field(&event, "source"), "kubelet");
        event["source"] = json!({});
        assert_eq!(selectable_field(&event, "source"), "myapp-operator");
        assert_eq!(selectable_field(&event, "involvedObject.uid"), "u1");
        assert_eq!(selectable_field(&event, "metadata.namespace"), "ns");
        assert_eq!(selectable_field(&event, "involvedObject.fieldPath"), "");
    }
}
