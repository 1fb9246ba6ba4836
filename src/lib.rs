//! myapp-operator: a controller for the `MyApp` custom resource and its admission webhook.
#![forbid(unsafe_code)]
