//! The columns of each built-in kind's Table, with the descriptions the API server sends.

/// One column of a built-in kind's Table.
pub struct Column {
    /// Header (kubectl prints it upper-cased).
    pub name: &'static str,
    /// `string`, `integer` or `date`.
    pub type_: &'static str,
    /// `name` for the object's name column, else empty.
    pub format: &'static str,
    /// 0 is shown by default; 1 only with `-o wide`.
    pub priority: i32,
    /// What the column shows.
    pub description: &'static str,
}

const fn column(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column {
        name,
        type_,
        format: "",
        priority: 0,
        description,
    }
}

const fn wide(name: &'static str, description: &'static str) -> Column {
    Column {
        name,
        type_: "string",
        format: "",
        priority: 1,
        description,
    }
}

const NAME: Column = Column {
    name: "Name",
    type_: "string",
    format: "name",
    priority: 0,
    description: "Name must be unique within a namespace.",
};
const AGE: Column = column(
    "Age",
    "string",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);
const CONTAINERS: Column = wide("Containers", "Names of each container in the template.");
const IMAGES: Column = wide(
    "Images",
    "Images referenced by each container in the template.",
);

pub(super) const DEPLOYMENT: &[Column] = &[
    NAME,
    column("Ready", "string", "Number of the pod with ready state"),
    column(
        "Up-to-date",
        "string",
        "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
    ),
    column(
        "Available",
        "string",
        "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    wide(
        "Selector",
        "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
    ),
];

/// `rest.NewDefaultTableConvertor`'s columns (`apiserver/pkg/registry/rest/table.go`), which
/// kinds without a printer of their own, CRDs among them, are served with.
pub(super) const DEFAULT: &[Column] = &[
    NAME,
    column(
        "Created At",
        "date",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    ),
];

pub(super) const REPLICA_SET: &[Column] = &[
    NAME,
    column(
        "Desired",
        "integer",
        "Replicas is the number of desired pods.",
    ),
    column(
        "Current",
        "integer",
        "Replicas is the most recently observed number of non-terminating pods.",
    ),
    column(
        "Ready",
        "integer",
        "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    wide(
        "Selector",
        "Selector is a label query over pods that should match the replica count.",
    ),
];

pub(super) const POD: &[Column] = &[
    NAME,
    column(
        "Ready",
        "string",
        "The aggregate readiness state of this pod for accepting traffic.",
    ),
    column(
        "Status",
        "string",
        "The aggregate status of the containers in this pod.",
    ),
    column(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    wide("IP", "podIP address allocated to the pod."),
    wide("Node", "Name of the Node this pod is assigned to."),
    wide(
        "Nominated Node",
        "nominatedNodeName is set when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.",
    ),
    wide(
        "Readiness Gates",
        "If specified, all readiness gates will be evaluated for pod readiness.",
    ),
];

pub(super) const SERVICE: &[Column] = &[
    NAME,
    column(
        "Type",
        "string",
        "type determines how the Service is exposed.",
    ),
    column(
        "Cluster-IP",
        "string",
        "clusterIP is the IP address of the service and is usually assigned randomly.",
    ),
    column(
        "External-IP",
        "string",
        "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
    ),
    column(
        "Port(s)",
        "string",
        "The list of ports that are exposed by this service.",
    ),
    AGE,
    wide(
        "Selector",
        "Route service traffic to pods with label keys and values matching this selector.",
    ),
];

pub(super) const EVENT: &[Column] = &[
    column(
        "Last Seen",
        "string",
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    column(
        "Type",
        "string",
        "Type of this event (Normal, Warning), new types could be added in the future",
    ),
    column(
        "Reason",
        "string",
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    column("Object", "string", "The object that this event is about."),
    wide(
        "Subobject",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
    ),
    wide(
        "Source",
        "The component reporting this event. Should be a short machine understandable string.",
    ),
    column(
        "Message",
        "string",
        "A human-readable description of the status of this operation.",
    ),
    wide(
        "First Seen",
        "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
    ),
    wide("Count", "The number of times this event has occurred."),
    Column {
        name: "Name",
        type_: "string",
        format: "name",
        priority: 1,
        description: "Name must be unique within a namespace.",
    },
];
