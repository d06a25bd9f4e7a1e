//! datafusion-python's FFI: a table's snapshot handed to a datafusion-python `SessionContext`
//! as a `datafusion_table_provider` capsule (the same DataFusion version on both sides).

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::errors::InvalidArgumentError;

const PROVIDER: &std::ffi::CStr = c"datafusion_table_provider";
const CODEC: &std::ffi::CStr = c"datafusion_logical_extension_codec";

/// The logical extension codec of the asking session (a `SessionContext`, or its codec capsule),
/// which the provider's filters travel through.
pub fn logical_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    let capsule = match session.hasattr("__datafusion_logical_extension_codec__")? {
        true => session.call_method0("__datafusion_logical_extension_codec__")?,
        false => session.clone(),
    };
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
        InvalidArgumentError::new_err(
            "__datafusion_table_provider__ takes the asking datafusion SessionContext (datafusion 55)",
        )
    })?;
    let ptr = capsule.pointer_checked(Some(CODEC))?;
    // SAFETY: the capsule holds an `FFI_LogicalExtensionCodec` (checked by name), alive while the
    // capsule is; the clone holds its own reference.
    let codec = unsafe { &*ptr.as_ptr().cast::<FFI_LogicalExtensionCodec>() };
    Ok(codec.clone())
}

/// `provider` in a capsule datafusion-python registers, its work run on oxlake's runtime.
pub fn provider_capsule<'py>(
    py: Python<'py>,
    provider: Arc<dyn TableProvider>,
    codec: FFI_LogicalExtensionCodec,
) -> PyResult<Bound<'py, PyCapsule>> {
    let runtime = crate::runtime::runtime()?;
    let ffi = FFI_TableProvider::new_with_ffi_codec(provider, true, Some(runtime.handle().clone()), codec);
    PyCapsule::new_with_value(py, ffi, PROVIDER)
}
