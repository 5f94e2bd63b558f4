// Type declarations of idempotency-pg's ESM entry point: the named exports
// of the CommonJS one, and all of them as the default export.
export * from './index.js';
import * as idempotencyPg from './index.js';
export default idempotencyPg;
