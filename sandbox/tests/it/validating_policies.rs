//! ValidatingAdmissionPolicy and its Binding as kube-apiserver 1.33 serves and evaluates them:
//! the objects' own validation, the Deny, Warn and Audit actions with the API server's texts,
//! `failurePolicy` on evaluation errors, matching, and Gateway API's safe-upgrades bundle.

mod safe_upgrades;

use crate::support::fixtures::client;
use crate::support::kubectl::{served_kubectl, stderr, stdout};

use kube::Client;
use kube::core::Status;
use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;
use serde_json::{Value, json};

const POLICIES: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
const BINDINGS: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";
const CONFIG_MAPS: &str = "/api/v1/namespaces/default/configmaps";

async fn send(
    client: &Client,
    method: &str,
    uri: &str,
    body: &Value,
) -> Result<Value, Box<Status>> {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    match client.request_text(request).await {
        Ok(text) => Ok(serde_json::from_str(&text).unwrap()),
        Err(kube::Error::Api(status)) => Err(status),
        Err(other) => panic!("not an API error: {other}"),
    }
}

async fn create(client: &Client, uri: &str, body: Value) -> Result<Value, Box<Status>> {
    send(client, "POST", uri, &body).await
}

/// A policy on ConfigMap creates and updates with `validations`, and `extra` merged into its spec.
fn policy(name: &str, validations: Value, extra: Value) -> Value {
    let mut spec = json!({
        "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"],
        }]},
        "validations": validations,
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
           "metadata": {"name": name}, "spec": spec})
}

fn binding(name: &str, policy: &str, actions: Value) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
           "metadata": {"name": name}, "spec": {"policyName": policy, "validationActions": actions}})
}

fn config_map(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

/// A sandbox holding `policy` bound once as `b` with `actions`.
async fn with_policy(policy: Value, actions: Value) -> (Sandbox, Client) {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let name = policy["metadata"]["name"].as_str().unwrap().to_owned();
    create(&client, POLICIES, policy)
        .await
        .expect("policy created");
    create(&client, BINDINGS, binding("b", &name, actions))
        .await
        .expect("binding created");
    (sandbox, client)
}

/// The 422 causes of a refused policy or binding, as `field: message`, after checking the
/// summary names the object.
async fn refused(uri: &str, object: Value) -> Vec<String> {
    let sandbox = Sandbox::new();
    let status = create(&client(&sandbox), uri, object.clone())
        .await
        .expect_err("refused");
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    let kind = object["kind"].as_str().unwrap();
    let name = object["metadata"]["name"].as_str().unwrap();
    let prefix = format!("{kind}.admissionregistration.k8s.io \"{name}\" is invalid: ");
    assert!(status.message.starts_with(&prefix), "{}", status.message);
    let causes = status.details.expect("details").causes;
    causes
        .into_iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect()
}

#[tokio::test]
async fn bindings_are_refused_with_the_api_servers_messages() {
    let both = "spec.validationActions: Invalid value: []admissionregistration.ValidationAction{\"Deny\", \"Warn\"}: must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)";
    let cases = [
        (
            json!({"validationActions": ["Deny"]}),
            vec!["spec.policyName: Required value"],
        ),
        (
            json!({"policyName": "p"}),
            vec![
                "spec.validationActions: Required value: at least one validation action is required",
            ],
        ),
        (
            json!({"policyName": "p", "validationActions": ["Deny", "Warn"]}),
            vec![both],
        ),
        (
            json!({"policyName": "p", "validationActions": ["Deny", "Deny"]}),
            vec!["spec.validationActions[1]: Duplicate value: \"Deny\""],
        ),
        (
            json!({"policyName": "p", "validationActions": ["Block"]}),
            vec![
                "spec.validationActions[0]: Unsupported value: \"Block\": supported values: \"Audit\", \"Deny\", \"Warn\"",
            ],
        ),
        (
            json!({"policyName": "P_1", "validationActions": ["Audit"]}),
            vec![
                "spec.policyName: Invalid value: \"P_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ],
        ),
        (
            json!({"policyName": "p", "validationActions": ["Deny"], "matchResources": {"matchPolicy": "Fuzzy"}}),
            vec![
                "spec.matchResouces.matchPolicy: Unsupported value: \"Fuzzy\": supported values: \"Equivalent\", \"Exact\"",
            ],
        ),
    ];
    for (spec, wanted) in cases {
        let mut object = binding("b", "p", json!([]));
        object["spec"] = spec.clone();
        assert_eq!(refused(BINDINGS, object).await, wanted, "{spec}");
    }
}

#[tokio::test]
async fn policies_are_refused_with_the_api_servers_messages() {
    let valid = json!([{"expression": "true"}]);
    let cases = [
        (
            policy("p", json!([]), json!({})),
            vec![
                "spec.validations: Required value: validations or auditAnnotations must contain at least one item",
                "spec.auditAnnotations: Required value: validations or auditAnnotations must contain at least one item",
            ],
        ),
        (
            policy("p", json!([{"expression": "object.data.x == "}]), json!({})),
            vec![
                "spec.validations[0].expression: Invalid value: \"object.data.x == \": compilation failed: ERROR: <input>:1:18: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n | object.data.x == \n | .................^",
            ],
        ),
        (
            policy(
                "p",
                json!([{"expression": "true", "reason": "Teapot"}]),
                json!({}),
            ),
            vec![
                "spec.validations[0].reason: Unsupported value: \"Teapot\": supported values: \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\"",
            ],
        ),
        (
            policy(
                "p",
                valid.clone(),
                json!({"variables": [{"name": "in", "expression": "1"}]}),
            ),
            vec![
                "spec.variables[0].name: Invalid value: \"in\": name is not a valid CEL identifier",
            ],
        ),
        (
            policy(
                "p",
                valid.clone(),
                json!({"matchConstraints": {"resourceRules": [
                {"apiGroups": ["*", "apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["*", "pods"]}]}}),
            ),
            vec![
                "spec.matchConstraints.resourceRules[0].apiGroups: Invalid value: []string{\"*\", \"apps\"}: if '*' is present, must not specify other API groups",
                "spec.matchConstraints.resourceRules[0].resources: Invalid value: []string{\"*\", \"pods\"}: if '*' is present, must not specify other resources without subresources",
            ],
        ),
        (
            policy(
                "p",
                valid.clone(),
                json!({"matchConstraints": {"namespaceSelector": {}}}),
            ),
            vec!["spec.matchConstraints.resourceRules: Required value"],
        ),
    ];
    for (object, wanted) in cases {
        assert_eq!(refused(POLICIES, object.clone()).await, wanted, "{object}");
    }
}

#[tokio::test]
async fn params_are_refused_until_the_sandbox_models_them() {
    let with_kind = policy(
        "p",
        json!([{"expression": "true"}]),
        json!({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}),
    );
    assert_eq!(
        refused(POLICIES, with_kind).await,
        [format!(
            "spec.paramKind: Forbidden: {}",
            kube_sandbox::admission::PARAMS_NOT_MODELLED
        )]
    );
    let mut with_ref = binding("b", "p", json!(["Deny"]));
    with_ref["spec"]["paramRef"] = json!({"name": "cm", "parameterNotFoundAction": "Deny"});
    assert_eq!(
        refused(BINDINGS, with_ref).await,
        [format!(
            "spec.paramRef: Forbidden: {}",
            kube_sandbox::admission::PARAMS_NOT_MODELLED
        )]
    );
}

#[tokio::test]
async fn stored_objects_carry_the_api_servers_defaults() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let stored = create(
        &client,
        POLICIES,
        policy("p", json!([{"expression": "true"}]), json!({})),
    )
    .await
    .unwrap();
    assert_eq!(stored["spec"]["failurePolicy"], "Fail");
    let constraints = &stored["spec"]["matchConstraints"];
    assert_eq!(constraints["matchPolicy"], "Equivalent");
    assert_eq!(constraints["namespaceSelector"], json!({}));
    assert_eq!(constraints["objectSelector"], json!({}));
    assert_eq!(constraints["resourceRules"][0]["scope"], "*");
    assert_eq!(stored["metadata"]["generation"], 1);
}

#[tokio::test]
async fn deny_refuses_with_the_api_servers_status_and_message() {
    let validations = json!([
        {"expression": "object.data.size() <= variables.limit",
         "messageExpression": "'at most ' + string(variables.limit) + ' keys, got ' + string(object.data.size())"},
        {"expression": "!has(object.data.secret)", "message": "no secrets here", "reason": "Forbidden"},
        {"expression": "!has(object.data.forbidden)"},
    ]);
    let spec = json!({"variables": [{"name": "limit", "expression": "2"}]});
    let (_sandbox, client) = with_policy(policy("p", validations, spec), json!(["Deny"])).await;
    create(&client, CONFIG_MAPS, config_map("ok", json!({"a": "1"})))
        .await
        .expect("admitted");

    let status = create(
        &client,
        CONFIG_MAPS,
        config_map("big", json!({"a": "1", "b": "2", "c": "3"})),
    )
    .await
    .expect_err("denied");
    let denied =
        "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: at most 2 keys, got 3";
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        format!("configmaps \"big\" is forbidden: {denied}")
    );
    let details = status.details.unwrap();
    assert_eq!(
        (details.kind.as_str(), details.name.as_str()),
        ("configmaps", "big")
    );
    assert_eq!(details.causes.len(), 1);
    assert_eq!(
        (
            details.causes[0].field.as_str(),
            details.causes[0].message.as_str()
        ),
        ("", denied)
    );

    let status = create(
        &client,
        CONFIG_MAPS,
        config_map("s", json!({"secret": "x"})),
    )
    .await
    .expect_err("denied");
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert!(
        status.message.ends_with("denied request: no secrets here"),
        "{}",
        status.message
    );

    let status = create(
        &client,
        CONFIG_MAPS,
        config_map("f", json!({"forbidden": "x"})),
    )
    .await
    .expect_err("denied");
    assert!(
        status
            .message
            .ends_with("denied request: failed expression: !has(object.data.forbidden)"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn failure_policy_applies_to_evaluation_errors_only() {
    let validations =
        json!([{"expression": "object.data.missing == 'x'", "message": "never shown"}]);
    let (_sandbox, client) =
        with_policy(policy("p", validations.clone(), json!({})), json!(["Deny"])).await;
    let status = create(&client, CONFIG_MAPS, config_map("c", json!({"a": "1"})))
        .await
        .expect_err("fails closed");
    assert_eq!(
        status.message,
        "configmaps \"c\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: expression 'object.data.missing == 'x'' resulted in error: no such key: missing"
    );
    assert_eq!(status.code, 422);

    let ignore = json!({"failurePolicy": "Ignore"});
    let (_sandbox, client) =
        with_policy(policy("p", validations, ignore.clone()), json!(["Deny"])).await;
    create(&client, CONFIG_MAPS, config_map("c", json!({"a": "1"})))
        .await
        .expect("an evaluation error is ignored");
    // A validation that is false still denies under Ignore.
    let (_sandbox, client) = with_policy(
        policy(
            "p",
            json!([{"expression": "false", "message": "no"}]),
            ignore,
        ),
        json!(["Deny"]),
    )
    .await;
    let status = create(&client, CONFIG_MAPS, config_map("c", json!({})))
        .await
        .expect_err("denied");
    assert!(
        status.message.ends_with("denied request: no"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn match_conditions_and_constraints_choose_the_requests() {
    let validations = json!([{"expression": "false", "message": "denied"}]);
    let extra = json!({
        "matchConditions": [{"name": "labelled", "expression": "has(object.metadata.labels) && 'checked' in object.metadata.labels"}],
        "matchConstraints": {
            "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}],
            "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"], "resourceNames": ["exempt"]}],
        },
    });
    let (_sandbox, client) = with_policy(policy("p", validations, extra), json!(["Deny"])).await;
    let labelled = |name: &str| {
        let mut cm = config_map(name, json!({}));
        cm["metadata"]["labels"] = json!({"checked": "yes"});
        cm
    };
    create(&client, CONFIG_MAPS, config_map("plain", json!({})))
        .await
        .expect("a false match condition skips the policy");
    create(&client, CONFIG_MAPS, labelled("exempt"))
        .await
        .expect("excluded by name");
    create(&client, CONFIG_MAPS, labelled("checked"))
        .await
        .expect_err("matched and denied");
    create(
        &client,
        "/api/v1/namespaces",
        json!({"metadata": {"name": "other"}}),
    )
    .await
    .expect("another resource");
}

#[tokio::test]
async fn a_bindings_match_resources_and_the_namespace_object_narrow_the_policy() {
    let validations = json!([{"expression": "namespaceObject.metadata.name == 'default' && request.operation == 'CREATE'",
                               "messageExpression": "'not in ' + namespaceObject.metadata.name"}]);
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    create(&client, POLICIES, policy("p", validations, json!({})))
        .await
        .unwrap();
    let mut bound = binding("b", "p", json!(["Deny"]));
    bound["spec"]["matchResources"] =
        json!({"namespaceSelector": {"matchLabels": {"env": "prod"}}});
    create(&client, BINDINGS, bound).await.unwrap();
    for (name, env) in [("prod", "prod"), ("dev", "dev")] {
        let ns = json!({"metadata": {"name": name, "labels": {"env": env}}});
        create(&client, "/api/v1/namespaces", ns).await.unwrap();
    }
    create(
        &client,
        "/api/v1/namespaces/dev/configmaps",
        config_map("c", json!({})),
    )
    .await
    .expect("the binding does not select dev");
    let status = create(
        &client,
        "/api/v1/namespaces/prod/configmaps",
        config_map("c", json!({})),
    )
    .await
    .expect_err("denied in prod");
    assert!(
        status.message.ends_with("denied request: not in prod"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn warn_and_audit_admit_with_a_warning_and_an_audit_annotation() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let client = client(&sandbox);
    let validations = json!([{"expression": "true"}, {"expression": "!has(object.data.legacy)", "message": "legacy is deprecated"}]);
    create(&client, POLICIES, policy("p", validations, json!({})))
        .await
        .unwrap();
    create(
        &client,
        BINDINGS,
        binding("b", "p", json!(["Warn", "Audit"])),
    )
    .await
    .unwrap();
    let file = k.file(
        "cm.json",
        &config_map("c", json!({"legacy": "1"})).to_string(),
    );
    let out = k.run(&["apply", "-f", path_str(&file)]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "Warning: Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': legacy is deprecated"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "configmap/c created\n");
    let annotations = sandbox.admission().audit_annotations();
    assert_eq!(annotations.len(), 1, "{annotations:?}");
    assert_eq!(
        annotations[0].key,
        "validation.policy.admission.k8s.io/validation_failure"
    );
    assert_eq!(annotations[0].name, "c");
    let value: Value = serde_json::from_str(&annotations[0].value).unwrap();
    assert_eq!(
        value,
        json!([{"message": "legacy is deprecated", "policy": "p", "binding": "b",
                "expressionIndex": 1, "validationActions": ["Warn", "Audit"]}])
    );
}

#[tokio::test]
async fn kubectl_gets_policies_and_prints_a_denial_as_on_a_cluster() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let bundle = format!(
        "{}\n---\n{}",
        serde_json::to_string(&policy(
            "p",
            json!([{"expression": "!has(object.data.x)", "message": "no x"}]),
            json!({})
        ))
        .unwrap(),
        serde_json::to_string(&binding("b", "p", json!(["Deny"]))).unwrap(),
    );
    let file = k.file("policy.yaml", &bundle);
    let out = k.ok(&["apply", "-f", path_str(&file)]).await;
    assert_eq!(
        out,
        "validatingadmissionpolicy.admissionregistration.k8s.io/p created\nvalidatingadmissionpolicybinding.admissionregistration.k8s.io/b created\n"
    );
    let names = k
        .ok(&[
            "get",
            "validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        names,
        "validatingadmissionpolicy.admissionregistration.k8s.io/p\nvalidatingadmissionpolicybinding.admissionregistration.k8s.io/b\n"
    );
    let cm = k.file("cm.json", &config_map("c", json!({"x": "1"})).to_string());
    let out = k.run(&["apply", "-f", path_str(&cm)]).await;
    assert!(!out.status.success());
    // kubectl prints an Invalid error's causes after the object; this one has no field.
    assert_eq!(
        stderr(&out),
        "The configmaps \"c\" is invalid: : ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no x\n"
    );
}
