//! The `AdmissionReview` as it arrives (borrowed from the body where possible) and as it is
//! answered.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::object::Object;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReviewIn<'a> {
    #[serde(borrow)]
    pub(super) api_version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) request: Option<RequestIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RequestIn<'a> {
    #[serde(borrow)]
    pub(super) uid: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) kind: Option<KindIn<'a>>,
    #[serde(borrow)]
    pub(super) operation: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) namespace: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) sub_resource: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) object: Option<Object<'a>>,
    #[serde(borrow)]
    pub(super) old_object: Option<Object<'a>>,
    #[serde(default)]
    pub(super) dry_run: Option<bool>,
}

#[derive(Deserialize, Default)]
pub(super) struct KindIn<'a> {
    #[serde(borrow, default)]
    pub(super) group: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) kind: Cow<'a, str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReviewOut<'a> {
    pub(super) api_version: &'static str,
    pub(super) kind: &'static str,
    pub(super) response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResponseOut<'a> {
    pub(super) uid: &'a str,
    pub(super) allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) status: Option<StatusOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) warnings: Vec<String>,
}

#[derive(Serialize)]
pub(super) struct StatusOut {
    pub(super) metadata: Empty,
    pub(super) status: &'static str,
    pub(super) code: u16,
    pub(super) reason: &'static str,
    pub(super) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) details: Option<DetailsOut>,
}

#[derive(Serialize)]
pub(super) struct Empty {}

#[derive(Serialize)]
pub(super) struct DetailsOut {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(super) name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(super) group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(super) kind: String,
    pub(super) causes: Vec<CauseOut>,
}

#[derive(Serialize)]
pub(super) struct CauseOut {
    pub(super) reason: &'static str,
    pub(super) message: String,
    pub(super) field: String,
}
