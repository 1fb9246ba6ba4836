//! One RBAC permission the operator's code needs. The tables live next to the calls that need
//! them (`controller::PERMISSIONS`, `leader::PERMISSIONS`); `check` asks the API server about
//! each, and `tests/it/rbac.rs` proves the tables equal both `deploy/base/rbac.yaml` and the requests
//! the operator makes over a whole life cycle.

/// Where a permission is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// In every namespace (granted by the ClusterRole `myapp-operator`).
    Cluster,
    /// In the operator's own namespace only (the Role `myapp-operator-leader-election`).
    OperatorNamespace,
}

/// An (apiGroup, resource, verb) triple, as an RBAC rule spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// Resource, `resource/subresource` for a subresource.
    pub resource: &'static str,
    /// Verb.
    pub verb: &'static str,
    /// Where.
    pub scope: Scope,
}

impl Permission {
    /// A permission needed in every namespace.
    pub const fn cluster(group: &'static str, resource: &'static str, verb: &'static str) -> Self {
        Self {
            group,
            resource,
            verb,
            scope: Scope::Cluster,
        }
    }

    /// A permission needed in the operator's namespace.
    pub const fn namespaced(
        group: &'static str,
        resource: &'static str,
        verb: &'static str,
    ) -> Self {
        Self {
            group,
            resource,
            verb,
            scope: Scope::OperatorNamespace,
        }
    }

    /// The resource without its subresource, and the subresource (`myapps/status`).
    pub fn split_resource(&self) -> (&'static str, Option<&'static str>) {
        match self.resource.split_once('/') {
            Some((resource, sub)) => (resource, Some(sub)),
            None => (self.resource, None),
        }
    }

    /// The RBAC rule that grants exactly this permission, in the YAML flow style of
    /// `deploy/base/rbac.yaml`.
    pub fn rule(&self) -> String {
        format!(
            "{{apiGroups: [\"{}\"], resources: [\"{}\"], verbs: [\"{}\"]}}",
            self.group, self.resource, self.verb
        )
    }
}
