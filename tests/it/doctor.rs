//! medea doctor
