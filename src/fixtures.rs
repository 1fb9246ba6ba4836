//! Test objects, built in one chained expression: `MyApp::test("web").replicas(Some(2))`.
//! Compiled for the crate's own tests and with the `dev` feature (the integration tests and
//! benchmarks), never into the shipped binary.

use k8s_openapi::jiff::Timestamp;

use crate::crd::{EnvVar, MyApp, MyAppSpec, MyAppStatus};

/// The image every test MyApp starts with.
pub const TEST_IMAGE: &str = "ghcr.io/example/web:1.4.2";

impl MyApp {
    /// A valid MyApp named `name`, as a client would create it: 2 replicas of `TEST_IMAGE` on
    /// port 8080, no env, no status, and no server-set metadata.
    pub fn test(name: &str) -> Self {
        MyApp::new(
            name,
            MyAppSpec {
                replicas: Some(2),
                image: TEST_IMAGE.into(),
                port: 8080,
                env: vec![],
            },
        )
    }

    /// As the API server returns it after the create: in namespace `default` (unless set),
    /// with a uid, generation 1 and a resourceVersion.
    pub fn stored(mut self) -> Self {
        let meta = &mut self.metadata;
        meta.namespace.get_or_insert_with(|| "default".into());
        let name = meta.name.as_deref().unwrap_or_default();
        meta.uid = Some(format!("00000000-0000-4000-8000-{:012x}", name.len()));
        meta.generation = Some(1);
        meta.resource_version = Some("1".into());
        self
    }

    /// In namespace `namespace`.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.metadata.namespace = Some(namespace.into());
        self
    }

    /// With the label `key`=`value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    /// With `spec.replicas` (`None`: left to an autoscaler).
    pub fn replicas(mut self, replicas: Option<i32>) -> Self {
        self.spec.replicas = replicas;
        self
    }

    /// With `spec.image`.
    pub fn image(mut self, image: &str) -> Self {
        self.spec.image = image.into();
        self
    }

    /// With `spec.port`.
    pub fn port(mut self, port: i32) -> Self {
        self.spec.port = port;
        self
    }

    /// With one more `spec.env` entry.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.spec.env.push(EnvVar {
            name: name.into(),
            value: value.into(),
        });
        self
    }

    /// At `metadata.generation`.
    pub fn generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }

    /// With this status.
    pub fn status(mut self, status: MyAppStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Being deleted (a `deletionTimestamp` is set).
    pub fn deleted(mut self) -> Self {
        self.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        self
    }
}
