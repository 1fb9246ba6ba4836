use serde_json::{Value, json};

use super::*;

fn deployment(spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec})
}

fn containers(containers: Value) -> Value {
    deployment(json!({"template": {"spec": {"containers": containers}}}))
}

#[test]
fn the_table_parses_and_names_every_served_built_in_kind() {
    let registry = crate::registry::Registry::builtin();
    // Not in the table: CRDs (apiextensions-apiserver's types) and the reviews, never stored.
    let left_out = [
        "CustomResourceDefinition",
        "SelfSubjectAccessReview",
        "SubjectAccessReview",
        "SelfSubjectReview",
    ];
    for rt in registry.all() {
        assert_eq!(
            is_modelled(&rt.api_version(), &rt.kind),
            !left_out.contains(&rt.kind.as_str()),
            "{} {}",
            rt.api_version(),
            rt.kind
        );
    }
}

#[test]
fn an_empty_env_value_and_an_empty_env_list_are_left_out() {
    let mut d = containers(json!([
        {"name": "a", "image": "i", "env": [{"name": "A", "value": ""}, {"name": "B", "value": "b"}]},
        {"name": "b", "image": "i", "env": [], "args": []},
    ]));
    omit_empty(&mut d);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"],
        json!([
            {"name": "a", "image": "i", "env": [{"name": "A"}, {"name": "B", "value": "b"}]},
            {"name": "b", "image": "i"},
        ])
    );
}

#[test]
fn zero_values_behind_pointers_and_struct_values_stay() {
    let spec = json!({
        "replicas": 0,
        "revisionHistoryLimit": 0,
        "paused": false,
        "minReadySeconds": 0,
        "selector": {},
        "template": {
            "metadata": {"creationTimestamp": null, "labels": {}},
            "spec": {
                "securityContext": {},
                "terminationGracePeriodSeconds": 0,
                "hostNetwork": false,
                "containers": [{
                    "name": "",
                    "resources": {},
                    "securityContext": {"privileged": false, "runAsUser": 0},
                    "ports": [{"containerPort": 0, "name": "", "protocol": "TCP"}],
                    "readinessProbe": {"httpGet": {"port": 0, "path": ""}, "periodSeconds": 0},
                }],
            },
        },
    });
    let mut d = deployment(spec);
    omit_empty(&mut d);
    assert_eq!(
        d["spec"],
        json!({
            "replicas": 0,
            "revisionHistoryLimit": 0,
            "selector": {},
            "template": {
                "metadata": {"creationTimestamp": null},
                "spec": {
                    "securityContext": {},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        // `Container.name` has no omitempty.
                        "name": "",
                        "resources": {},
                        "securityContext": {"privileged": false, "runAsUser": 0},
                        "ports": [{"containerPort": 0, "protocol": "TCP"}],
                        // `port` is an IntOrString: a struct, never omitted.
                        "readinessProbe": {"httpGet": {"port": 0}},
                    }],
                },
            },
        })
    );
}

#[test]
fn nulls_go_from_omitempty_fields_and_maps_keep_their_empty_values() {
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "deletionTimestamp": null, "annotations": {"a": ""}, "finalizers": []},
        "data": {"k": ""},
        "stringData": {},
        "type": "",
        "immutable": null,
    });
    omit_empty(&mut secret);
    assert_eq!(
        secret,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "s", "annotations": {"a": ""}}, "data": {"k": ""}})
    );
}

#[test]
fn byte_slices_are_empty_as_empty_strings() {
    let mut hooks = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "w"},
        "webhooks": [{"name": "a.b.c", "clientConfig": {"caBundle": "", "url": "https://x"}}],
    });
    omit_empty(&mut hooks);
    assert_eq!(
        hooks["webhooks"][0]["clientConfig"],
        json!({"url": "https://x"})
    );
}

#[test]
fn unknown_fields_and_other_kinds_are_not_touched() {
    let mut d =
        containers(json!([{"name": "a", "x-unknown": "", "env": [{"name": "A", "extra": []}]}]));
    let before = d.clone();
    omit_empty(&mut d);
    assert_eq!(d, before);
    let mut custom = json!({"apiVersion": "example.com/v1", "kind": "Deployment",
                            "metadata": {"labels": {}}, "spec": {"replicas": 0, "x": ""}});
    let before = custom.clone();
    omit_empty(&mut custom);
    assert_eq!(custom, before);
}

#[test]
fn both_event_apis_drop_their_own_empty_fields() {
    let mut core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
                          "reason": "", "count": 0, "reportingComponent": "", "source": {"host": ""}});
    omit_empty(&mut core);
    // `reportingComponent` has no omitempty; `source` is a struct value.
    assert_eq!(
        core,
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
               "reportingComponent": "", "source": {}})
    );
    let mut events = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
                            "note": "", "reportingController": "", "eventTime": null});
    omit_empty(&mut events);
    assert_eq!(
        events,
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
               "eventTime": null})
    );
}

#[test]
fn an_empty_managed_fields_list_is_left_for_the_field_manager() {
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "c", "managedFields": []}});
    omit_empty(&mut cm);
    assert_eq!(cm["metadata"]["managedFields"], json!([]));
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "c", "managedFields": [{"manager": "", "subresource": ""}]}});
    omit_empty(&mut cm);
    assert_eq!(cm["metadata"]["managedFields"], json!([{}]));
}
