/*
 * pydflash2 native core: the C API that Python reaches through cffi.
 *
 * Everything between the cdef markers is plain C that cffi parses as is
 * (no preprocessor lines there). Functions never abort: they return NULL or
 * a non-zero code and leave a message for pdf2_last_error().
 * Strings returned as `char *` are owned by the caller: free them with
 * pdf2_free_string().
 */
#ifndef PYDFLASH2_H
#define PYDFLASH2_H

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */

/* Message of the last failed call on this thread ("" if none). */
const char * pdf2_last_error(void);

/* Frees a string returned by this library. NULL is allowed. */
void pdf2_free_string(char * s);

/* JSON object: ggml/llama build info and the ggml backend devices present. */
char * pdf2_native_info_json(void);

/* Checks a drafter GGUF against the dflash contract without loading weights.
 * JSON object of hyperparameters on success, NULL (see pdf2_last_error) when
 * the file is unreadable or violates the contract. */
char * pdf2_inspect_drafter_json(const char * path);

/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* PYDFLASH2_H */
