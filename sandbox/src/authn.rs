//! Who is asking: users, bearer tokens that stand for them, and impersonation headers, as
//! kube-apiserver's token authenticators and impersonation filter see a request.
//!
//! Real sources: `staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/bearertoken.go`
//! (the header), `pkg/serviceaccount/claims.go` (a bound token's username, groups and
//! `credential-id`), `pkg/authentication/group/authenticated_group_adder.go`
//! (`system:authenticated`) and `pkg/endpoints/filters/impersonation.go`.

use std::collections::{BTreeMap, HashMap};

use axum::http::HeaderMap;

use crate::status::ApiError;

/// The group whose members pass every authorization check (kube-apiserver's privileged group).
pub const MASTERS: &str = "system:masters";
/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The extra key a bound ServiceAccount token's identity is reported under.
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
/// The id of the admin token the sandbox's own kubeconfig carries.
pub const ADMIN_TOKEN_ID: &str = "admin";

const SA_PREFIX: &str = "system:serviceaccount:";

/// An authenticated user, as `user.Info` in kube-apiserver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// `system:serviceaccount:<ns>:<name>` for a ServiceAccount.
    pub username: String,
    /// A unique id (empty when unknown).
    pub uid: String,
    /// Groups, `system:authenticated` included once authenticated.
    pub groups: Vec<String>,
    /// Extra attributes (`authentication.kubernetes.io/credential-id`, ...).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with no groups yet (authentication adds `system:authenticated`).
    pub fn user(username: impl Into<String>) -> Self {
        UserInfo {
            username: username.into(),
            ..UserInfo::default()
        }
    }

    /// A ServiceAccount, named and grouped as its tokens authenticate it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            username: format!("{SA_PREFIX}{namespace}:{name}"),
            uid: String::new(),
            groups: service_account_groups(namespace),
            extra: BTreeMap::new(),
        }
    }

    /// The sandbox's administrator: in `system:masters`, like kubeadm's admin.conf user.
    pub fn admin() -> Self {
        Self::user("sandbox-admin")
            .group(MASTERS)
            .group(AUTHENTICATED)
    }

    /// Adds a group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        let group = group.into();
        if !self.groups.contains(&group) {
            self.groups.push(group);
        }
        self
    }

    /// Sets the uid.
    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    /// Whether authorization is skipped for this user (member of `system:masters`).
    pub fn is_privileged(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// The ServiceAccount (namespace, name) this username names, if it names one.
    pub fn service_account_name(&self) -> Option<(&str, &str)> {
        parse_service_account(&self.username)
    }

    /// As admission requests and `SelfSubjectReview` carry it (`authentication.k8s.io/v1`).
    pub fn to_api(&self) -> k8s_openapi::api::authentication::v1::UserInfo {
        k8s_openapi::api::authentication::v1::UserInfo {
            username: Some(self.username.clone()),
            uid: (!self.uid.is_empty()).then(|| self.uid.clone()),
            groups: Some(self.groups.clone()),
            extra: (!self.extra.is_empty()).then(|| self.extra.clone()),
        }
    }
}

fn service_account_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
    ]
}

fn parse_service_account(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix(SA_PREFIX)?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// One registered token: its id (what the request log shows) and whom it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// The token's id, as the caller named it (`replica-0`); never the secret.
    pub id: String,
    /// The user the token authenticates as, `credential-id` extra included.
    pub user: UserInfo,
}

/// Who made a request: the user and, when a token authenticated it, that token's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user requests are authorized as (the impersonated one, if any).
    pub user: UserInfo,
    /// The id of the token that authenticated the request; None when authentication is off.
    pub token_id: Option<String>,
}

/// The token authenticator: off (everyone is the admin) or a table of bearer tokens.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tokens {
    enabled: bool,
    by_secret: HashMap<String, Credential>,
    by_id: BTreeMap<String, String>,
}

impl Tokens {
    /// Turns authentication on, with the admin token registered.
    pub(crate) fn enable(&mut self) {
        if !self.enabled {
            self.enabled = true;
            self.register(ADMIN_TOKEN_ID, UserInfo::admin());
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Registers a token for `user` under `id` (replacing one of the same id) and turns
    /// authentication on. The secret is random, as a real token is unguessable.
    pub(crate) fn register(&mut self, id: &str, mut user: UserInfo) {
        self.enable();
        if let Some(old) = self.by_id.remove(id) {
            self.by_secret.remove(&old);
        }
        if user.service_account_name().is_some() {
            // A bound token's JWT id, so the audit log (here: the request log) tells replicas apart.
            user.extra
                .insert(CREDENTIAL_ID.to_string(), vec![format!("JTI={id}")]);
        }
        let secret = format!("sandbox.{}", uuid::Uuid::new_v4().simple());
        self.by_id.insert(id.to_string(), secret.clone());
        self.by_secret.insert(
            secret,
            Credential {
                id: id.to_string(),
                user,
            },
        );
    }

    /// The secret of the token registered as `id`.
    pub(crate) fn secret(&self, id: &str) -> Option<String> {
        self.by_id.get(id).cloned()
    }

    /// The identity of a request from its `Authorization` header. When authentication is
    /// off, everyone is the admin; when on, a missing or unknown token is 401 (the sandbox
    /// models `--anonymous-auth=false`).
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, ApiError> {
        if !self.enabled {
            return Ok(Identity {
                user: UserInfo::admin(),
                token_id: None,
            });
        }
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        let credential = self.by_secret.get(token).ok_or_else(unauthorized)?;
        Ok(Identity {
            user: credential.user.clone().group(AUTHENTICATED),
            token_id: Some(credential.id.clone()),
        })
    }
}

/// The 401 kube-apiserver answers for a request it cannot authenticate
/// (`pkg/endpoints/handlers/responsewriters`, `Unauthorized` via the authentication filter).
pub fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// What `Impersonate-*` headers ask to act as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Impersonation {
    pub(crate) user: Option<String>,
    pub(crate) uid: Option<String>,
    pub(crate) groups: Vec<String>,
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

impl Impersonation {
    /// The requested impersonation, or None when no `Impersonate-*` header is present.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ApiError> {
        let mut out = Impersonation::default();
        let mut any = false;
        for (name, value) in headers {
            let name = name.as_str();
            let Some(what) = name.strip_prefix("impersonate-") else {
                continue;
            };
            any = true;
            let value = value.to_str().unwrap_or("").to_string();
            match what {
                "user" => out.user = Some(value),
                "uid" => out.uid = Some(value),
                "group" => out.groups.push(value),
                other => match other.strip_prefix("extra-") {
                    Some(key) => out
                        .extra
                        .entry(percent_unescape(key))
                        .or_default()
                        .push(value),
                    None => continue,
                },
            }
        }
        if !any {
            return Ok(None);
        }
        if out.user.is_none() {
            return Err(ApiError::bad_request(
                "requested impersonation of groups, uid or extra without impersonating a user",
            ));
        }
        Ok(Some(out))
    }

    /// The user the request then acts as: a ServiceAccount keeps its groups when none are
    /// asked for, and everyone but `system:anonymous` is in `system:authenticated`.
    pub(crate) fn user(&self) -> UserInfo {
        let username = self.user.clone().unwrap_or_default();
        let mut groups = self.groups.clone();
        if groups.is_empty()
            && let Some((ns, _)) = parse_service_account(&username)
        {
            groups = service_account_groups(ns);
        }
        let mut user = UserInfo {
            username,
            uid: self.uid.clone().unwrap_or_default(),
            groups,
            extra: self.extra.clone(),
        };
        if user.username != "system:anonymous" {
            user = user.group(AUTHENTICATED);
        }
        user
    }
}

fn percent_unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        headers
    }

    #[test]
    fn two_tokens_of_one_service_account_authenticate_as_it_with_their_own_ids() {
        let mut tokens = Tokens::default();
        tokens.register("replica-0", UserInfo::service_account("ops", "op"));
        tokens.register("replica-1", UserInfo::service_account("ops", "op"));
        let a = tokens
            .authenticate(&bearer(&tokens.secret("replica-0").unwrap()))
            .unwrap();
        let b = tokens
            .authenticate(&bearer(&tokens.secret("replica-1").unwrap()))
            .unwrap();
        assert_eq!(a.user.username, "system:serviceaccount:ops:op");
        assert_eq!(a.user.username, b.user.username);
        assert_eq!(
            a.user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ops",
                "system:authenticated"
            ]
        );
        assert_eq!(a.token_id.as_deref(), Some("replica-0"));
        assert_eq!(b.user.extra[CREDENTIAL_ID], ["JTI=replica-1"]);
    }

    #[test]
    fn a_missing_or_unknown_token_is_unauthorized_once_authentication_is_on() {
        let mut tokens = Tokens::default();
        assert!(
            tokens
                .authenticate(&HeaderMap::new())
                .unwrap()
                .user
                .is_privileged()
        );
        tokens.enable();
        assert_eq!(
            tokens.authenticate(&HeaderMap::new()).unwrap_err().code,
            401
        );
        assert_eq!(tokens.authenticate(&bearer("nope")).unwrap_err().code, 401);
        let admin = tokens.secret(ADMIN_TOKEN_ID).unwrap();
        assert!(
            tokens
                .authenticate(&bearer(&admin))
                .unwrap()
                .user
                .is_privileged()
        );
    }

    #[test]
    fn an_impersonated_service_account_gets_its_groups() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "impersonate-user",
            "system:serviceaccount:ns:sa".parse().unwrap(),
        );
        let imp = Impersonation::from_headers(&headers).unwrap().unwrap();
        assert_eq!(
            imp.user().groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                "system:authenticated"
            ]
        );
    }
}
