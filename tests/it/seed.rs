//! medea seed
