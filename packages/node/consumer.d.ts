// Type declarations of idempotency-pg's broker consumer (re-exported by
// index.d.ts). Structural types stand in for amqplib's, so that no type
// package is needed.
import type { PoolLike, Queryable } from './index';

/** A delivery as amqplib hands it over. */
export interface BrokerMessage {
  content: Uint8Array;
  fields: { deliveryTag: number; redelivered: boolean; exchange?: string; routingKey?: string; [field: string]: any };
  properties: {
    messageId?: string;
    correlationId?: string;
    replyTo?: string;
    headers?: Record<string, any>;
    deliveryMode?: number;
    [property: string]: any;
  };
}

/** What amqplib's Channel (or ConfirmChannel) offers that the consumer uses. */
export interface BrokerChannel {
  consume(queue: string, onMessage: (message: BrokerMessage | null) => void,
    options?: { noAck?: boolean; consumerTag?: string }): Promise<{ consumerTag: string }>;
  cancel(consumerTag: string): Promise<unknown>;
  ack(message: BrokerMessage, allUpTo?: boolean): void;
  nack(message: BrokerMessage, allUpTo?: boolean, requeue?: boolean): void;
  publish(exchange: string, routingKey: string, content: Uint8Array, options?: Record<string, any>): boolean;
  sendToQueue(queue: string, content: Uint8Array, options?: Record<string, any>): boolean;
  /** Present on a ConfirmChannel: replies, retries and dead letters wait for it before the ack. */
  waitForConfirms?(): Promise<void>;
}

export type ConsumerOutcome = 'ran' | 'stored_error' | 'replayed' | 'replayed_error';

export interface ConsumerEvent {
  type: 'delivered' | 'committing' | 'committed' | 'replied' | 'acked' | 'requeued' | 'retried'
    | 'dead-lettered' | 'cancelled' | 'error';
  message: BrokerMessage | null;
  key?: string;
  /** 'gone' (on acked): the message ran before and its answer is no longer kept (IK410); it was not run, nothing was replied. */
  outcome?: ConsumerOutcome | 'gone';
  response?: unknown;
  redelivered?: boolean;
  attempts?: number;
  code?: string;
  reason?: string;
  error?: unknown;
}

export interface ConsumeOptions<Payload = any, Answer = any> {
  channel: BrokerChannel;
  queue: string;
  /** The node-postgres Pool each message's transaction is taken from (at least as large as the prefetch). */
  pool: PoolLike;
  /** Applies the message in its transaction (db); its result (a JSON value) is stored and replied. */
  handler: (db: Queryable, payload: Payload, message: BrokerMessage) => Promise<Answer> | Answer;
  /** The idempotency key (default: the message id), from the message and its parsed payload. */
  key?: (message: BrokerMessage, payload: Payload) => string | undefined;
  /** The request fingerprint (default: hex SHA-256 of the message body). */
  requestHash?: (message: BrokerMessage, payload: Payload) => string | null;
  /** Parses the body (default: JSON). */
  parse?: (content: Uint8Array, message: BrokerMessage) => Payload;
  /** Handler errors that are the message's answer: stored and replied like a result, never retried. */
  isStoredError?: (error: any) => boolean;
  /** Where IK422, poison and unparsable messages go, with x-idempotency-reason and x-idempotency-code headers. */
  deadLetter?: { exchange?: string; routingKey: string };
  /** idempotency.wait_timeout for the claim. */
  waitTimeout?: number | string;
  /** Handler failures before a message is dead-lettered (default 5). */
  maxAttempts?: number;
  /** Milliseconds to wait before the attempt-th requeue or retry. */
  backoff?: (attempt: number) => number;
  /**
   * Messages per transaction (default 1: one transaction per message). Above 1, deliveries are
   * gathered into batches, claimed with one idempotency.claim_batch and committed together; the
   * channel's prefetch is set to twice it.
   */
  batchSize?: number;
  /** In batch mode, how long a batch waits for more deliveries after its first (default 10 ms). */
  batchWaitMs?: number;
  /** Called synchronously at each step of a delivery (for logs and metrics). */
  onEvent?: (event: ConsumerEvent) => void;
  consumerTag?: string;
}

/** Consumes queue, applying each message once through the idempotency extension; acks after the commit. */
export function consume<Payload = any, Answer = any>(options: ConsumeOptions<Payload, Answer>):
  Promise<{ consumerTag: string; cancel(): Promise<unknown> }>;

/** Claims key, runs work and stores its answer in one transaction of a client taken from pool. */
export function applyOnce<T>(pool: PoolLike, options: {
  key: string; requestHash?: string | null; waitTimeout?: number | string;
  isStoredError?: ((error: any) => boolean) | null; beforeCommit?: () => void;
}, work: (db: Queryable) => Promise<T> | T): Promise<{
  outcome: ConsumerOutcome;
  /** The answer as stored (read back from jsonb). */
  response: T | ErrorDocument;
  /** The stored answer's jsonb text: what a reply carries. */
  text: string | null;
}>;

export interface ErrorDocument {
  error: { sqlstate: string | null; message: string | null; detail: string | null; hint: string | null };
}
/** The document stored for an error: the shape idempotent_call stores with idempotency.store_errors. */
export function errorDocument(error: unknown): ErrorDocument;
