//! Finding a GPU and opening it.
//!
//! wgpu's own environment variables choose what is looked at:
//! `WGPU_BACKEND` (e.g. `vulkan`, `metal`, `dx12`, `gl`) limits the backends,
//! and `WGPU_ADAPTER_NAME` picks the first adapter whose name contains it
//! (case-insensitive). Without a name, a discrete GPU is preferred, then an
//! integrated one, then anything else, and a CPU (software) adapter last.
//! `RAID_GPU=off` hides every adapter, for an operator who wants the CPU
//! engine whatever the array's setting says.

use crate::GpuError;

/// What the rest of the crate needs to know of the adapter it opened.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// The adapter's name as the driver reports it.
    pub name: String,
    /// The backend it came through ("vulkan", ...).
    pub backend: String,
    /// Whether the adapter is a CPU implementation (Mesa lavapipe,
    /// SwiftShader, WARP): it runs the shaders correctly but never faster
    /// than the CPU engine, so `auto` does not use it.
    pub is_cpu: bool,
    /// Driver name and version, for bug reports.
    pub driver: String,
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}", self.name, self.backend)?;
        if self.is_cpu {
            f.write_str(", CPU adapter")?;
        }
        f.write_str(")")
    }
}

pub(crate) struct Opened {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
    pub limits: wgpu::Limits,
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Opens the adapter the environment asks for, or the best one present,
/// with every limit the adapter offers (buffer sizes and dispatch sizes are
/// then read back from the device rather than assumed).
pub(crate) fn open() -> Result<Opened, GpuError> {
    if std::env::var("RAID_GPU").is_ok_and(|v| v == "off" || v == "0") {
        return Err(GpuError::NoAdapter(
            "RAID_GPU=off hides every GPU adapter".into(),
        ));
    }
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
    if adapters.is_empty() {
        return Err(GpuError::NoAdapter(
            "wgpu found no adapter (no GPU driver, or no Vulkan loader/ICD installed; \
             on a machine without a GPU, Mesa's lavapipe gives a CPU one)"
                .into(),
        ));
    }
    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
    let adapter = match std::env::var("WGPU_ADAPTER_NAME") {
        Ok(want) => {
            let want = want.to_lowercase();
            let i = names
                .iter()
                .position(|n| n.to_lowercase().contains(&want))
                .ok_or_else(|| {
                    GpuError::NoAdapter(format!(
                        "WGPU_ADAPTER_NAME={want} matches none of the adapters found: {}",
                        names.join(", ")
                    ))
                })?;
            adapters.swap_remove(i)
        }
        Err(_) => {
            adapters.sort_by_key(|a| rank(a.get_info().device_type));
            adapters.swap_remove(0)
        }
    };
    let info = adapter.get_info();
    let limits = adapter.limits();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("raid-gpu"),
        required_features: wgpu::Features::empty(),
        required_limits: limits.clone(),
        ..Default::default()
    }))
    .map_err(|e| GpuError::Device(format!("{}: {e}", info.name)))?;
    let limits = device.limits();
    let summary = AdapterSummary {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend).to_lowercase(),
        is_cpu: info.device_type == wgpu::DeviceType::Cpu,
        driver: format!("{} {}", info.driver, info.driver_info)
            .trim()
            .to_string(),
    };
    tracing::info!(adapter = %summary, driver = %summary.driver,
        max_binding = limits.max_storage_buffer_binding_size,
        max_buffer = limits.max_buffer_size,
        "GPU adapter opened");
    Ok(Opened {
        device,
        queue,
        summary,
        limits,
    })
}
