// Workflow time. Temporal makes `new Date()` deterministic inside workflows
// (it is the time of the current workflow task).
export const nowMs = (): number => new Date().getTime();
export const nowIso = (): string => new Date().toISOString();
