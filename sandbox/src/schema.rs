//! Structural-schema validation and pruning of custom resources (being written).
