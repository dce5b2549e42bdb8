// The workflow bundle's entry: every workflow type the worker registers.
export { runWorkflow } from './run-workflow';
export { sandboxWorkflow } from './sandbox-workflow';
export { webhookDeliveryWorkflow } from './webhook-delivery';
