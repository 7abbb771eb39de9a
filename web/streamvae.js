// StreamVAE frontend extension.
//
// - Snaps frame-count widgets (Encode's batch_size, Test Pattern's frames) to 4n+1, the clip lengths
//   video VAEs work in (batch_size also keeps 0 = one clip).
// - Shows on Encode/Decode nodes (and Decode to Video / Encode from Video) the tile grid (rows x cols
//   x temporal chunks) and the predicted peak memory for the current settings, from GET
//   /streamvae/plan; after a run, what the run used.
// - Shows the detected family on Load VAE (GET /streamvae/checkpoint), and what was loaded after a run.
//
// The clip size for a prediction is read from the graph upstream (a node with width/height widgets,
// such as StreamVAE Test Pattern or Empty Hunyuan Latent Video); when there is none, the node says
// so until it has run once.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const LOADER = "StreamVAELoader";
const ENCODE = "StreamVAEEncode";
const DECODE = "StreamVAEDecode";
const DECODE_TO_VIDEO = "StreamVAEDecodeToVideo";
const ENCODE_FROM_VIDEO = "StreamVAEEncodeFromVideo";
const PATTERN = "StreamVAETestPattern";
// Nodes that show the predicted plan and, after a run, what it used.
const PLANNED = [ENCODE, DECODE, DECODE_TO_VIDEO, ENCODE_FROM_VIDEO];
const ENCODERS = [ENCODE, ENCODE_FROM_VIDEO];

// Widgets snapped to 4n+1; `zero` keeps 0 as a valid value.
const SNAPPED = {
    [ENCODE]: [{ name: "batch_size", zero: true }],
    [PATTERN]: [{ name: "frames", zero: false }],
};
const FRAME_WIDGETS = ["frames", "length", "num_frames", "frame_count", "batch_size"];
const INFO_LINE = 18;

export function snap4n1(value, allowZero) {
    const v = Math.round(Number(value) || 0);
    if (v <= 0) return allowZero ? 0 : 1;
    return 4 * Math.round((v - 1) / 4) + 1;
}

function widget(node, name) {
    return node.widgets?.find((w) => w.name === name);
}

function value(node, name, fallback) {
    const w = widget(node, name);
    return w === undefined ? fallback : w.value;
}

function gib(bytes) {
    return bytes == null ? "n/a" : `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

function gridText(plan) {
    const [rows, cols, chunks] = plan.grid;
    const caches = plan.cache_offload && plan.cache_offload !== "none" ? ` \u00b7 caches on ${plan.cache_offload}` : "";
    return `${rows}\u00d7${cols}\u00d7${chunks} tiles${caches}`;
}

// How the plan picks kernels; said only when they are measured (the default) and none is on record yet,
// because then the first run also times each new layer shape once.
function kernelText(plan) {
    if (plan.kernel_choice === "defaults") return " \u00b7 default kernels";
    return plan.kernels_on_record === 0 ? " \u00b7 kernels timed on first run" : "";
}

// The node feeding input `name`, or null.
function source(node, name) {
    const slot = node.inputs?.findIndex((i) => i.name === name) ?? -1;
    return slot >= 0 && node.inputs[slot].link != null ? node.getInputNode(slot) : null;
}

// Clip size {width, height, frames} found upstream of `node` through IMAGE/LATENT inputs, or null.
function upstreamSize(node, depth = 0) {
    if (!node || depth > 12) return null;
    const width = value(node, "width"), height = value(node, "height");
    if (width > 0 && height > 0) { // 0 = "keep the file's size" (Encode from Video): unknown here
        const name = FRAME_WIDGETS.find((n) => typeof value(node, n) === "number");
        return { width, height, frames: name ? Math.max(1, value(node, name)) : 1 };
    }
    for (const [slot, input] of (node.inputs ?? []).entries()) {
        if ((input.type === "IMAGE" || input.type === "LATENT") && input.link != null) {
            const found = upstreamSize(node.getInputNode(slot), depth + 1);
            // A StreamVAE Encode with batch_size k hands on clips of k frames.
            if (found && node.comfyClass === ENCODE && value(node, "batch_size", 0) > 0) found.frames = value(node, "batch_size");
            if (found) return found;
        }
    }
    return null;
}

const cache = new Map();

async function getJson(path, params) {
    const query = new URLSearchParams(params).toString();
    const key = `${path}?${query}`;
    if (!cache.has(key)) {
        cache.set(key, api.fetchApi(key).then(async (r) => (r.ok ? r.json() : { error: (await r.json()).error, busy: r.status === 503 })));
    }
    try {
        const answer = await cache.get(key);
        if (answer.busy) cache.delete(key); // the server was busy: ask again at the next refresh
        return answer;
    } catch (error) {
        cache.delete(key);
        return { error: String(error) };
    }
}

// -- Encode / Decode: predicted tile grid and peak -------------------------------------------------

async function refreshPlan(node) {
    const loader = source(node, "vae");
    const encodes = ENCODERS.includes(node.comfyClass);
    const size = upstreamSize(source(node, encodes ? "image" : "samples"));
    if (!loader || loader.comfyClass !== LOADER || !value(loader, "vae_name")) {
        node.streamvaePrediction = "connect a StreamVAE Load VAE";
    } else if (!size) {
        node.streamvaePrediction = "grid and peak: shown after the first run";
    } else {
        let frames = size.frames;
        if (node.comfyClass === ENCODE && value(node, "batch_size", 0) > 0) frames = value(node, "batch_size");
        const answer = await getJson("/streamvae/plan", {
            vae_name: value(loader, "vae_name"),
            device: value(loader, "device", "auto"),
            encode_dtype: value(loader, "encode_dtype", "auto"),
            decode_dtype: value(loader, "decode_dtype", "auto"),
            op: encodes ? "encode" : "decode",
            width: size.width, height: size.height, frames,
            tile_size: value(node, "tile_size", 0),
            tile_overlap: value(node, "tile_overlap", 64),
            temporal_chunk: value(node, "temporal_chunk", 0),
            tiling: value(node, "tiling", "exact"),
            memory_budget_gb: value(node, "memory_budget_gb", 0),
            kernels: value(loader, "kernels", "measure"),
        });
        node.streamvaePrediction = answer.error
            ? `plan: ${answer.error}`
            : `${gridText(answer.plan)} \u00b7 peak ${gib(answer.plan.peak_bytes)} (predicted)${kernelText(answer.plan)}`;
    }
    node.setDirtyCanvas(true, false);
}

function scheduleRefresh(node) {
    clearTimeout(node.streamvaeTimer);
    node.streamvaeTimer = setTimeout(() => refreshPlan(node), 250);
}

function refreshAllPlans() {
    for (const node of app.graph?.nodes ?? []) {
        if (PLANNED.includes(node.comfyClass)) scheduleRefresh(node);
    }
}

function showRun(node, message) {
    const run = message?.streamvae_run?.[0];
    if (!run) return;
    const measured = run.measured_peak_bytes != null ? `, measured ${gib(run.measured_peak_bytes)}` : "";
    // A LATENT in another layout than core's B,C,T,H,W: say how Decode read it.
    const layout = run.latent_layout && !run.latent_layout.startsWith("B,C,T,H,W") ? ` \u00b7 read ${run.latent_layout}` : "";
    node.streamvaeRun = `last run: ${gridText(run.plan)} \u00b7 ${run.clips} clip(s) \u00b7 peak ${gib(run.plan.peak_bytes)}${measured}${layout}`;
    node.setDirtyCanvas(true, false);
}

// -- Load VAE: family ----------------------------------------------------------------------------

async function refreshFamily(node) {
    const name = value(node, "vae_name");
    if (!name) return;
    const answer = await getJson("/streamvae/checkpoint", { vae_name: name });
    node.streamvaePrediction = answer.error
        ? `not a StreamVAE checkpoint: ${answer.error}`
        : `${answer.family} \u00b7 ${answer.latent_channels} latent channels \u00b7 stored ${answer.stored_dtype}`;
    node.setDirtyCanvas(true, false);
}

function showModel(node, message) {
    const info = message?.streamvae_model?.[0];
    if (!info) return;
    const kernels = info.kernels === "defaults" ? " \u00b7 default kernels" : "";
    node.streamvaeRun = `loaded: ${info.family} \u00b7 enc ${info.encode_dtype} / dec ${info.decode_dtype} \u00b7 ${info.device} \u00b7 ${info.compile}${kernels}`;
    node.setDirtyCanvas(true, false);
}

// -- wiring ----------------------------------------------------------------------------------------

function infoLines(node) {
    return [node.streamvaePrediction, node.streamvaeRun].filter(Boolean);
}

function hookWidgets(node, refresh) {
    for (const w of node.widgets ?? []) {
        const snap = SNAPPED[node.comfyClass]?.find((s) => s.name === w.name);
        const callback = w.callback;
        w.callback = function (v, ...rest) {
            if (snap) {
                const snapped = snap4n1(this.value, snap.zero);
                if (snapped !== this.value) this.value = snapped;
            }
            const result = callback?.apply(this, [this.value, ...rest]);
            if (refresh) refresh(node);
            return result;
        };
    }
}

function extendNode(nodeType, refresh, onExecuted) {
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
        const r = created?.apply(this, arguments);
        hookWidgets(this, refresh);
        if (refresh) setTimeout(() => refresh(this), 0);
        return r;
    };
    const computeSize = nodeType.prototype.computeSize;
    nodeType.prototype.computeSize = function () {
        const size = computeSize ? computeSize.apply(this, arguments) : [200, 100];
        return [size[0], size[1] + 2 * INFO_LINE];
    };
    if (refresh) {
        const configure = nodeType.prototype.onConfigure;
        nodeType.prototype.onConfigure = function () {
            const r = configure?.apply(this, arguments);
            setTimeout(() => refresh(this), 0);
            return r;
        };
        const connections = nodeType.prototype.onConnectionsChange;
        nodeType.prototype.onConnectionsChange = function () {
            const r = connections?.apply(this, arguments);
            refresh(this);
            return r;
        };
    }
    const executed = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
        const r = executed?.apply(this, arguments);
        onExecuted?.(this, message);
        return r;
    };
    const draw = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
        const r = draw?.apply(this, arguments);
        const lines = infoLines(this);
        if (lines.length && !this.flags?.collapsed) {
            ctx.save();
            ctx.font = "11px sans-serif";
            ctx.fillStyle = "#9ab";
            lines.forEach((line, i) => {
                ctx.fillText(line, 10, this.size[1] - 8 - (lines.length - 1 - i) * (INFO_LINE - 4), this.size[0] - 20);
            });
            ctx.restore();
        }
        return r;
    };
}

app.registerExtension({
    name: "StreamVAE.nodes",
    async beforeRegisterNodeDef(nodeType, nodeData) {
        if (PLANNED.includes(nodeData.name)) {
            extendNode(nodeType, scheduleRefresh, showRun);
        } else if (nodeData.name === LOADER) {
            extendNode(nodeType, (node) => {
                refreshFamily(node);
                refreshAllPlans();
            }, showModel);
        } else if (nodeData.name === PATTERN) {
            const created = nodeType.prototype.onNodeCreated;
            nodeType.prototype.onNodeCreated = function () {
                const r = created?.apply(this, arguments);
                hookWidgets(this, refreshAllPlans); // a new size or frame count changes the plans downstream
                return r;
            };
        }
    },
});
