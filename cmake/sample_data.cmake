# sample_data.cmake — prepare the shipped sample corpus (Moby Dick) into
# <build>/data/sample with `tetra data prepare`, as part of the default build.
# training.dataset = "sample" resolves to that folder (data/loader.h).
#
# It is prepared again when the corpus, the tokenizer files or the code that
# writes the shards change (not on every relink of tetra).

set(TETRA_SAMPLE_CORPUS ${CMAKE_SOURCE_DIR}/tests/assets/moby_dick.txt)
set(TETRA_SAMPLE_TOKENIZER ${CMAKE_SOURCE_DIR}/tests/assets/tokenizer)
set(TETRA_SAMPLE_VAL_FRACTION 0.1)
set(TETRA_SAMPLE_DIR ${CMAKE_BINARY_DIR}/data/sample)

# Re-run the configure step when entries of tests/assets/ appear or go (e.g. the tokenizer).
file(GLOB TETRA_ASSET_ENTRIES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/assets/*)

if(TARGET tetra AND EXISTS ${TETRA_SAMPLE_CORPUS} AND IS_DIRECTORY ${TETRA_SAMPLE_TOKENIZER})
  file(GLOB TETRA_SAMPLE_TOKENIZER_FILES CONFIGURE_DEPENDS ${TETRA_SAMPLE_TOKENIZER}/*)
  file(GLOB TETRA_SAMPLE_CODE CONFIGURE_DEPENDS
    ${CMAKE_SOURCE_DIR}/data/tokenizer*.[ch] ${CMAKE_SOURCE_DIR}/data/bpe*.[ch]
    ${CMAKE_SOURCE_DIR}/data/pretok*.[ch] ${CMAKE_SOURCE_DIR}/data/prepare.[ch]
    ${CMAKE_SOURCE_DIR}/data/shard.[ch])
  add_custom_command(
    OUTPUT ${TETRA_SAMPLE_DIR}/index.json
    COMMAND ${CMAKE_COMMAND} -E rm -rf ${TETRA_SAMPLE_DIR}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/data
    COMMAND $<TARGET_FILE:tetra> data prepare
            --tokenizer ${TETRA_SAMPLE_TOKENIZER}
            --input ${TETRA_SAMPLE_CORPUS}
            --output ${TETRA_SAMPLE_DIR}
            --val-fraction ${TETRA_SAMPLE_VAL_FRACTION}
            --quiet
    DEPENDS ${TETRA_SAMPLE_CORPUS} ${TETRA_SAMPLE_TOKENIZER_FILES} ${TETRA_SAMPLE_CODE}
    COMMENT "Preparing the sample corpus (Moby Dick) into data/sample"
    VERBATIM)
  add_custom_target(tetra_sample_data ALL DEPENDS ${TETRA_SAMPLE_DIR}/index.json)
  add_dependencies(tetra_sample_data tetra)
elseif(NOT TARGET tetra)
  message(STATUS "tetra: sample corpus not prepared (no tetra executable target)")
else()
  message(STATUS "tetra: sample corpus not prepared (tests/assets/moby_dick.txt or tests/assets/tokenizer/ missing)")
endif()
